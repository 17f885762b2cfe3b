//! A connection's stream as hyper sees it: each response written whole within the write
//! timeout, and the end of each reported to the budget of unsent bytes
//! ([`super::unsent`]).
//!
//! A response starts with the first write after the last flush and ends when a flush
//! completes: hyper flushes once its buffer is empty, i.e. once the kernel (or, over TLS,
//! rustls on its way to the kernel) has taken every byte. A client that does not read
//! fills its socket's buffers and the writes wait; past the deadline they fail with
//! `TimedOut`, hyper ends the connection and the response's memory is freed. The time
//! the server takes to produce a response does not count: nothing is written meanwhile.

use std::{
    future::Future,
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    time::Sleep,
};

use super::{connection::Connection, unsent::Unsent};

pub(super) struct Watched<S> {
    inner: S,
    connection: Arc<Connection>,
    unsent: Arc<Unsent>,
    write_timeout: Duration,
    /// While a response is being written: when it must be written by.
    deadline: Option<Pin<Box<Sleep>>>,
}

impl<S> Watched<S> {
    pub(super) fn new(inner: S, connection: Arc<Connection>, unsent: Arc<Unsent>, write_timeout: Duration) -> Self {
        Watched { inner, connection, unsent, write_timeout, deadline: None }
    }

    /// Starts the deadline at a response's first write.
    fn start_response(&mut self) {
        if self.deadline.is_none() {
            self.deadline = Some(Box::pin(tokio::time::sleep(self.write_timeout)));
        }
    }

    /// `TimedOut` once the response's deadline passed; otherwise wakes the task at it.
    fn check_deadline(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        let expired = self.deadline.as_mut().is_some_and(|deadline| deadline.as_mut().poll(cx).is_ready());
        if !expired {
            return Ok(());
        }
        self.connection.mark_write_timed_out();
        Err(io::Error::new(io::ErrorKind::TimedOut, "the client did not read its response within the write timeout"))
    }

    /// The response is written whole: its deadline and its unsent bytes go.
    fn end_response(&mut self) {
        if self.deadline.take().is_some() {
            self.unsent.release(self.connection.id());
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        this.start_response();
        this.check_deadline(cx)?;
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        this.start_response();
        this.check_deadline(cx)?;
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    /// As the stream's: hyper queues a response's buffers (the page shared, not copied)
    /// only over a stream that takes them vectored.
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        this.check_deadline(cx)?;
        let flushed = Pin::new(&mut this.inner).poll_flush(cx);
        if let Poll::Ready(Ok(())) = flushed {
            this.end_response();
        }
        flushed
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        this.check_deadline(cx)?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests;
