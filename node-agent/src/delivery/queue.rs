//! What a sink has to send and has not sent yet (a CloudWatch sink's datums, the health
//! event stream's records, an OTLP sink's requests): bounded, the oldest making room for
//! the newest; a request's items are in flight until sent, given up or put back; the
//! shutdown waits for it to drain. Items count 1 each, or their weight (an OTLP request:
//! its data points), so that the bound and the counts are in what users think in.

use std::{
    collections::VecDeque,
    sync::{Mutex, MutexGuard},
};

use tokio::sync::Notify;

/// How a queue reports itself.
pub trait QueueMetrics {
    /// Items (their weight) queued or in flight.
    fn depth(&self, items: usize);
    /// Items (their weight) given up, and why ([`QUEUE_FULL`] when the newest pushed them
    /// out).
    fn dropped(&self, reason: &'static str, items: usize);
}

/// The reason of items pushed out by newer ones.
pub const QUEUE_FULL: &str = "queue_full";

pub struct Queue<T, M> {
    state: Mutex<State<T>>,
    /// Something was pushed: the sender wakes.
    pub notify: Notify,
    /// Emptied: the shutdown waits on it.
    drained: Notify,
    /// In weight units.
    capacity: usize,
    weight: fn(&T) -> usize,
    metrics: M,
}

struct State<T> {
    items: VecDeque<T>,
    /// The weight of `items`.
    queued: usize,
    /// The weight of the request in flight.
    in_flight: usize,
}

impl<T, M: QueueMetrics> Queue<T, M> {
    /// A queue of at most `capacity` items.
    pub fn new(capacity: usize, metrics: M) -> Self {
        Self::weighted(capacity, metrics, |_| 1)
    }

    /// A queue of items of `weight` each, at most `capacity` in all (and at least the
    /// newest item, whatever its weight).
    pub fn weighted(capacity: usize, metrics: M, weight: fn(&T) -> usize) -> Self {
        Queue {
            state: Mutex::new(State { items: VecDeque::new(), queued: 0, in_flight: 0 }),
            notify: Notify::new(),
            drained: Notify::new(),
            capacity: capacity.max(1),
            weight,
            metrics,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn publish_depth(&self, state: &State<T>) {
        let depth = state.queued + state.in_flight;
        self.metrics.depth(depth);
        if depth == 0 {
            self.drained.notify_waiters();
        }
    }

    /// Adds items; the oldest queued make room when the queue is full (the newest item
    /// always stays).
    pub fn push(&self, items: impl IntoIterator<Item = T>) {
        let mut state = self.lock();
        let before = state.items.len();
        for item in items {
            state.queued += (self.weight)(&item);
            state.items.push_back(item);
        }
        if state.items.len() == before {
            return;
        }
        let room = self.capacity.saturating_sub(state.in_flight).max(1);
        let mut dropped = 0;
        while state.queued > room && state.items.len() > 1 {
            if let Some(oldest) = state.items.pop_front() {
                let w = (self.weight)(&oldest);
                state.queued -= w;
                dropped += w;
            }
        }
        if dropped > 0 {
            self.metrics.dropped(QUEUE_FULL, dropped);
        }
        self.publish_depth(&state);
        drop(state);
        self.notify.notify_one();
    }

    /// The oldest queued item (not in flight), seen through `f`.
    pub fn front<R>(&self, f: impl FnOnce(Option<&T>) -> R) -> R {
        f(self.lock().items.front())
    }

    /// The next request, taken from the front by `take`: in flight until
    /// [`Queue::finish`] or [`Queue::put_back`].
    pub fn take<B>(&self, take: impl FnOnce(&mut VecDeque<T>) -> B) -> B {
        let mut state = self.lock();
        let batch = take(&mut state.items);
        let left: usize = state.items.iter().map(self.weight).sum();
        state.in_flight = state.queued - left.min(state.queued);
        state.queued = left;
        batch
    }

    /// The request in flight is over (sent or given up).
    pub fn finish(&self) {
        let mut state = self.lock();
        state.in_flight = 0;
        self.publish_depth(&state);
    }

    /// The request in flight failed and may succeed later: its items go back to the
    /// front.
    pub fn put_back(&self, items: Vec<T>) {
        let mut state = self.lock();
        state.in_flight = 0;
        for item in items.into_iter().rev() {
            state.queued += (self.weight)(&item);
            state.items.push_front(item);
        }
        self.publish_depth(&state);
    }

    /// Items (their weight) queued or in flight.
    pub fn len(&self) -> usize {
        let state = self.lock();
        state.queued + state.in_flight
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until nothing is queued or in flight.
    pub async fn wait_drained(&self) {
        loop {
            let notified = self.drained.notified();
            if self.is_empty() {
                return;
            }
            notified.await;
        }
    }

    /// Gives up everything queued or in flight.
    pub fn abandon(&self, reason: &'static str) {
        let mut state = self.lock();
        let n = state.queued + state.in_flight;
        state.items.clear();
        state.queued = 0;
        state.in_flight = 0;
        self.metrics.dropped(reason, n);
        self.publish_depth(&state);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// The latest depth, and every drop as (reason, items).
    type Reported = (usize, Vec<(&'static str, usize)>);

    #[derive(Clone, Default)]
    struct Seen(Arc<Mutex<Reported>>);

    impl QueueMetrics for Seen {
        fn depth(&self, items: usize) {
            self.0.lock().unwrap().0 = items;
        }
        fn dropped(&self, reason: &'static str, items: usize) {
            self.0.lock().unwrap().1.push((reason, items));
        }
    }

    fn take_two(items: &mut VecDeque<u32>) -> Vec<u32> {
        items.drain(..items.len().min(2)).collect()
    }

    #[test]
    fn the_oldest_make_room_and_in_flight_items_count() {
        let seen = Seen::default();
        let q = Queue::new(3, seen.clone());
        q.push([1, 2, 3, 4]);
        assert_eq!((q.len(), q.front(|f| f.copied())), (3, Some(2)));
        assert_eq!(seen.0.lock().unwrap().1, [(QUEUE_FULL, 1)]);
        let batch = q.take(take_two);
        assert_eq!((batch, q.len()), (vec![2, 3], 3));
        // Two in flight leave room for one queued item.
        q.push([5, 6]);
        assert_eq!((q.len(), q.front(|f| f.copied())), (3, Some(6)));
        q.put_back(vec![2, 3]);
        assert_eq!((q.len(), q.front(|f| f.copied())), (3, Some(2)));
        q.abandon("shutdown");
        assert!(q.is_empty());
        let seen = seen.0.lock().unwrap();
        assert_eq!((seen.0, seen.1.last().copied()), (0, Some(("shutdown", 3))));
    }

    #[test]
    fn a_full_flight_still_keeps_the_newest() {
        let q = Queue::new(2, Seen::default());
        q.push([1, 2]);
        let _ = q.take(take_two);
        q.push([3]);
        assert_eq!((q.len(), q.front(|f| f.copied())), (3, Some(3)));
        q.finish();
        assert_eq!(q.len(), 1);
    }

    #[test]
    fn weighted_items_count_their_weight() {
        let seen = Seen::default();
        // Each item weighs its value: a capacity of 10 "points".
        let q = Queue::weighted(10, seen.clone(), |n: &u32| *n as usize);
        q.push([4, 3, 2]);
        assert_eq!(q.len(), 9);
        // 6 more: 15 > 10, the oldest (4) goes, 11 > 10, then 3 goes.
        q.push([6]);
        assert_eq!((q.len(), q.front(|f| f.copied())), (8, Some(2)));
        assert_eq!(seen.0.lock().unwrap().1, [(QUEUE_FULL, 7)]);
        let batch = q.take(|items| items.pop_front());
        assert_eq!((batch, q.len()), (Some(2), 8), "in flight still counts");
        q.put_back(vec![2]);
        assert_eq!(q.len(), 8);
        let _ = q.take(|items| items.pop_front());
        q.finish();
        assert_eq!(q.len(), 6);
        // An item heavier than the whole capacity still goes in, alone.
        q.push([25]);
        assert_eq!((q.len(), q.front(|f| f.copied())), (25, Some(25)));
        q.abandon("shutdown");
        let seen = seen.0.lock().unwrap();
        assert_eq!((seen.0, seen.1.last().copied()), (0, Some(("shutdown", 25))));
    }

    #[tokio::test]
    async fn the_drain_is_awaited_until_the_flight_is_over() {
        let q = Arc::new(Queue::new(4, Seen::default()));
        q.push([1]);
        let _ = q.take(take_two);
        let waiter = tokio::spawn({
            let q = q.clone();
            async move { q.wait_drained().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        q.finish();
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter).await.unwrap().unwrap();
    }
}
