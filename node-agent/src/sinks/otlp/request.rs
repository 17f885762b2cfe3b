//! A snapshot's resources cut into export requests within the receiver's limits, each
//! encoded (protobuf) and compressed (gzip) once, so that a retry sends the same bytes.
//!
//! Limits: CloudWatch's OTLP endpoints refuse requests over 5 MB uncompressed and 10,000
//! spans or log events (the limits AWS documents for traces and logs; the metrics
//! endpoint names none of its own besides 150 labels per point). A request here carries
//! at most [`MAX_POINTS_PER_REQUEST`] points and [`MAX_REQUEST_BYTES`] of protobuf, well
//! inside both, and small enough for an OpenTelemetry Collector's default 4 MiB
//! (gRPC-inherited) limit.

use std::io::Write;

use flate2::{write::GzEncoder, Compression};
use opentelemetry_proto::tonic::{
    collector::metrics::v1::ExportMetricsServiceRequest,
    metrics::v1::{metric::Data, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics},
};
use prost::Message;

/// Data points per request.
pub const MAX_POINTS_PER_REQUEST: usize = 10_000;
/// Bytes of one request's protobuf, before compression.
pub const MAX_REQUEST_BYTES: usize = 1_000_000;
/// What nesting one message in another costs at most: its field tag and a length prefix
/// of up to 5 bytes (lengths below 4 GiB).
const FRAME: usize = 6;

/// One export request, encoded and compressed: what the queue holds and a retry resends.
#[derive(Clone, Debug)]
pub struct Request {
    /// The gzip-compressed protobuf body.
    pub body: Vec<u8>,
    /// Bytes of the protobuf before compression.
    pub raw_bytes: usize,
    pub points: usize,
}

impl Request {
    /// Encodes and compresses a request.
    pub fn encode(request: &ExportMetricsServiceRequest) -> std::io::Result<Request> {
        let raw = request.encode_to_vec();
        let mut gzip = GzEncoder::new(Vec::with_capacity(raw.len() / 8), Compression::default());
        gzip.write_all(&raw)?;
        let points = request
            .resource_metrics
            .iter()
            .flat_map(|r| &r.scope_metrics)
            .flat_map(|s| &s.metrics)
            .map(|m| points_of(m).len())
            .sum();
        Ok(Request { body: gzip.finish()?, raw_bytes: raw.len(), points })
    }
}

fn points_of(metric: &Metric) -> &[NumberDataPoint] {
    match &metric.data {
        Some(Data::Gauge(g)) => &g.data_points,
        Some(Data::Sum(s)) => &s.data_points,
        _ => &[],
    }
}

fn points_mut(metric: &mut Metric) -> Option<&mut Vec<NumberDataPoint>> {
    match &mut metric.data {
        Some(Data::Gauge(g)) => Some(&mut g.data_points),
        Some(Data::Sum(s)) => Some(&mut s.data_points),
        _ => None,
    }
}

/// The request being filled, and which resource, scope and metric of the snapshot its
/// last entries continue.
#[derive(Default)]
struct Filling {
    request: ExportMetricsServiceRequest,
    points: usize,
    /// An upper bound of the request's encoded size.
    bytes: usize,
    resource: Option<usize>,
    scope: Option<(usize, usize)>,
    metric: Option<(usize, usize, usize)>,
}

impl Filling {
    fn is_empty(&self) -> bool {
        self.points == 0
    }
}

/// Cuts a snapshot's resources into requests of at most `max_points` points and
/// `max_bytes` bytes each (a single point larger than that goes alone), keeping every
/// point under its resource, scope and metric.
pub fn split(resources: Vec<ResourceMetrics>, max_points: usize, max_bytes: usize) -> Vec<ExportMetricsServiceRequest> {
    let mut done = Vec::new();
    let mut filling = Filling::default();
    for (r, mut resource_metrics) in resources.into_iter().enumerate() {
        let scopes = std::mem::take(&mut resource_metrics.scope_metrics);
        let resource_header = resource_metrics.encoded_len() + FRAME;
        for (s, mut scope_metrics) in scopes.into_iter().enumerate() {
            let metrics = std::mem::take(&mut scope_metrics.metrics);
            let scope_header = scope_metrics.encoded_len() + FRAME;
            for (m, mut metric) in metrics.into_iter().enumerate() {
                let points = points_mut(&mut metric).map(std::mem::take).unwrap_or_default();
                // The metric's own fields, and the frame of its gauge or sum.
                let metric_header = metric.encoded_len() + 2 * FRAME;
                for point in points {
                    let point_bytes = point.encoded_len() + FRAME;
                    let need = |f: &Filling| {
                        point_bytes
                            + if f.metric == Some((r, s, m)) { 0 } else { metric_header }
                            + if f.scope == Some((r, s)) { 0 } else { scope_header }
                            + if f.resource == Some(r) { 0 } else { resource_header }
                    };
                    if !filling.is_empty()
                        && (filling.points + 1 > max_points || filling.bytes + need(&filling) > max_bytes)
                    {
                        done.push(std::mem::take(&mut filling).request);
                    }
                    filling.bytes += need(&filling);
                    if filling.resource != Some(r) {
                        filling
                            .request
                            .resource_metrics
                            .push(ResourceMetrics { scope_metrics: Vec::new(), ..resource_metrics.clone() });
                        filling.resource = Some(r);
                        filling.scope = None;
                        filling.metric = None;
                    }
                    let Some(target_resource) = filling.request.resource_metrics.last_mut() else { continue };
                    if filling.scope != Some((r, s)) {
                        target_resource
                            .scope_metrics
                            .push(ScopeMetrics { metrics: Vec::new(), ..scope_metrics.clone() });
                        filling.scope = Some((r, s));
                        filling.metric = None;
                    }
                    let Some(target_scope) = target_resource.scope_metrics.last_mut() else { continue };
                    if filling.metric != Some((r, s, m)) {
                        target_scope.metrics.push(metric.clone());
                        filling.metric = Some((r, s, m));
                    }
                    if let Some(target) = target_scope.metrics.last_mut().and_then(points_mut) {
                        target.push(point);
                        filling.points += 1;
                    }
                }
            }
        }
    }
    if !filling.is_empty() {
        done.push(filling.request);
    }
    done
}
