//! Samples in, datums out: what a sink collects between two flushes, and how the datums
//! of one flush are cut into requests within PutMetricData's limits.
//!
//! One datum per metric (name + dimension values) per flush, whatever the number of
//! samples: the distinct values with their counts (CloudWatch keeps their distribution,
//! so percentiles work) while there are at most [`MAX_VALUES`] of them, else the
//! statistic set (count, sum, min, max).

use std::{collections::HashMap, sync::Arc, time::SystemTime};

use api::cloudwatch::catalogue::Unit;

/// PutMetricData: datums per request.
pub const MAX_DATUMS_PER_REQUEST: usize = 1000;
/// PutMetricData: bytes per request (1 MB). The budget below is checked against an
/// over-estimate of the encoded size, so a request never reaches it.
pub const MAX_REQUEST_BYTES: usize = 1_000_000;
/// PutMetricData: values (and counts) per datum.
pub const MAX_VALUES: usize = 150;
pub use api::limits::MAX_DATUM_DIMENSIONS as MAX_DIMENSIONS;
/// Room for the namespace and the request's own framing.
const REQUEST_OVERHEAD: usize = 1024;

/// One metric: name, unit and dimension values, in a fixed order. Shared by the
/// accumulator and the datums it produces.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MetricKey {
    pub name: &'static str,
    pub dimensions: Vec<(&'static str, String)>,
}

/// What one datum carries.
#[derive(Clone, Debug, PartialEq)]
pub enum Values {
    /// Distinct values and how often each was seen.
    Distribution(Vec<(f64, f64)>),
    Statistics {
        count: f64,
        sum: f64,
        min: f64,
        max: f64,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Datum {
    pub key: Arc<MetricKey>,
    pub unit: Unit,
    pub values: Values,
    pub timestamp: SystemTime,
    /// 1 or 60 seconds.
    pub storage_resolution: i32,
}

impl Datum {
    /// An over-estimate of the datum's encoded size in a request (CBOR, or the larger
    /// query encoding's share of it): names and values plus generous framing.
    pub fn encoded_size(&self) -> usize {
        let dims: usize = self.key.dimensions.iter().map(|(n, v)| 24 + n.len() + v.len()).sum();
        let values = match &self.values {
            Values::Distribution(v) => 32 + v.len() * 2 * 10,
            Values::Statistics { .. } => 96,
        };
        // MetricName, Unit, Timestamp, StorageResolution keys and values.
        96 + self.key.name.len() + dims + values
    }

    /// Samples the datum stands for.
    pub fn sample_count(&self) -> f64 {
        match &self.values {
            Values::Distribution(v) => v.iter().map(|(_, c)| c).sum(),
            Values::Statistics { count, .. } => *count,
        }
    }
}

/// Samples of one metric since the last flush.
#[derive(Clone, Debug)]
struct Series {
    unit: Unit,
    /// `None` once more than [`MAX_VALUES`] distinct values were seen.
    distinct: Option<Vec<(f64, f64)>>,
    count: f64,
    sum: f64,
    min: f64,
    max: f64,
}

impl Series {
    fn new(unit: Unit) -> Self {
        Series { unit, distinct: Some(Vec::new()), count: 0.0, sum: 0.0, min: f64::INFINITY, max: f64::NEG_INFINITY }
    }

    fn add(&mut self, value: f64, count: f64) {
        self.count += count;
        self.sum += value * count;
        self.min = self.min.min(value);
        self.max = self.max.max(value);
        if let Some(distinct) = &mut self.distinct {
            match distinct.iter().position(|(v, _)| v.to_bits() == value.to_bits()) {
                Some(i) => distinct[i].1 += count,
                None if distinct.len() < MAX_VALUES => distinct.push((value, count)),
                None => self.distinct = None,
            }
        }
    }

    fn values(self) -> Values {
        match self.distinct {
            Some(distinct) => Values::Distribution(distinct),
            None => Values::Statistics { count: self.count, sum: self.sum, min: self.min, max: self.max },
        }
    }
}

/// What a sink collects between flushes.
#[derive(Debug, Default)]
pub struct Accumulator {
    gauges: HashMap<Arc<MetricKey>, Series>,
    /// Counts per metric since the last flush: sent as one value per flush (the count over
    /// the flush interval), so `Sum` over any period is the number of events in it.
    counts: HashMap<Arc<MetricKey>, (Unit, f64)>,
    /// Keys are interned: the same metric recurs every sample.
    keys: HashMap<MetricKey, Arc<MetricKey>>,
}

impl Accumulator {
    fn intern(&mut self, key: MetricKey) -> Arc<MetricKey> {
        if let Some(k) = self.keys.get(&key) {
            return k.clone();
        }
        let k = Arc::new(key.clone());
        self.keys.insert(key, k.clone());
        k
    }

    /// One sample of a gauge. Non-finite values are not samples.
    pub fn gauge(&mut self, key: MetricKey, unit: Unit, value: f64) {
        if !value.is_finite() {
            return;
        }
        let key = self.intern(key);
        self.gauges.entry(key).or_insert_with(|| Series::new(unit)).add(value, 1.0);
    }

    /// Events counted since the previous sample (0 keeps the metric alive: an idle
    /// application shows zero errors rather than no data).
    pub fn count(&mut self, key: MetricKey, value: f64) {
        if !value.is_finite() || value < 0.0 {
            return;
        }
        let key = self.intern(key);
        self.counts.entry(key).or_insert((Unit::Count, 0.0)).1 += value;
    }

    pub fn is_empty(&self) -> bool {
        self.gauges.is_empty() && self.counts.is_empty()
    }

    /// The datums of everything collected, stamped `timestamp`; the accumulator starts
    /// over. Sorted by metric, so requests are deterministic.
    pub fn drain(&mut self, timestamp: SystemTime, storage_resolution: i32) -> Vec<Datum> {
        let mut out: Vec<Datum> = Vec::with_capacity(self.gauges.len() + self.counts.len());
        for (key, series) in self.gauges.drain() {
            out.push(Datum { key, unit: series.unit, values: series.values(), timestamp, storage_resolution });
        }
        for (key, (unit, total)) in self.counts.drain() {
            out.push(Datum {
                key,
                unit,
                values: Values::Distribution(vec![(total, 1.0)]),
                timestamp,
                storage_resolution,
            });
        }
        // Keys not seen in this interval are forgotten, so a departed pod's keys go too.
        self.keys.clear();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out
    }
}

/// Cuts datums into requests: at most [`MAX_DATUMS_PER_REQUEST`] datums and
/// [`MAX_REQUEST_BYTES`] (estimated) each, in order.
pub fn split(datums: Vec<Datum>, namespace: &str) -> Vec<Vec<Datum>> {
    let mut queue: std::collections::VecDeque<Datum> = datums.into();
    let mut batches = Vec::new();
    while !queue.is_empty() {
        batches.push(take_batch(&mut queue, namespace));
    }
    batches
}

/// Takes the first request's worth of datums off `queue` (the same rule as [`split`]).
pub fn take_batch(queue: &mut std::collections::VecDeque<Datum>, namespace: &str) -> Vec<Datum> {
    let budget = MAX_REQUEST_BYTES - REQUEST_OVERHEAD - namespace.len();
    let mut batch = Vec::new();
    let mut size = 0;
    while let Some(next) = queue.front() {
        let s = next.encoded_size();
        if !batch.is_empty() && (batch.len() == MAX_DATUMS_PER_REQUEST || size + s > budget) {
            break;
        }
        size += s;
        if let Some(d) = queue.pop_front() {
            batch.push(d);
        }
    }
    batch
}
