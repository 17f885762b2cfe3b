//! One neuron-monitor report document (one NDJSON line).
//!
//! Parsing borrows from the line and skips what no exporter reads (`loaded_models` is
//! kept as JSON text and parsed on demand; [`Report::parse_reusing`], the agent's path,
//! does not even scan it with serde), so a 1 MB report costs well under a millisecond.
//! Unknown fields are ignored. A metric group is represented as [`Group`]: its data, the
//! error neuron-monitor reported for it, or the reason it could not be read. A null or
//! missing group is `None`; a null number is `None`. Nothing absent is turned into a zero.
//!
//! Only the first [`MAX_RUNTIMES_PER_REPORT`] runtime entries are read ([`Capped`]); the
//! rest are skipped unread and counted, so no report can size the agent's memory by the
//! number of its runtimes.
//!
//! [`Report::parse`] first tries one strict pass over the line. Only if that fails does
//! it parse again group by group, so that one odd group (a new release changing a
//! field's type) costs that group alone, not the whole document.

use std::{borrow::Cow, cell::Cell, fmt, marker::PhantomData, str::FromStr};

use serde::{
    de::{self, MapAccess, SeqAccess, Visitor},
    Deserialize, Deserializer,
};
use serde_json::value::RawValue;

use crate::limits::{
    MAX_K8S_CONTAINERS_PER_ENTRY, MAX_LOADED_MODELS_PER_RUNTIME, MAX_RUNTIMES_PER_REPORT, MAX_UNDOCUMENTED_NAMES,
    MAX_VALUE_NAME_BYTES,
};

mod cut;

#[derive(Debug, thiserror::Error)]
#[error("report is not a JSON object of the neuron-monitor format: {0}")]
pub struct ReportError(#[from] serde_json::Error);

impl ReportError {
    /// The line ended inside the document: it was cut short.
    pub fn is_truncated(&self) -> bool {
        self.0.is_eof()
    }
}

/// A parsed report, borrowing from its line.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Report<'a> {
    /// The first [`MAX_RUNTIMES_PER_REPORT`] entries, in document order.
    #[serde(borrow)]
    pub neuron_runtime_data: Capped<Item<RuntimeEntry<'a>>, MAX_RUNTIMES_PER_REPORT>,
    #[serde(borrow)]
    pub system_data: Option<SystemData<'a>>,
    #[serde(borrow)]
    pub instance_info: Option<Group<InstanceInfo<'a>>>,
    #[serde(borrow)]
    pub neuron_hardware_info: Option<Group<HardwareInfo<'a>>>,
    /// Where AWS's user guide places it; see [`Report::k8s_info`].
    #[serde(borrow)]
    pub neuron_k8s_info: Option<Group<K8sInfo<'a>>>,
}

impl<'a> Report<'a> {
    /// `neuron_k8s_info`, wherever the report carries it: at the top level (AWS's user
    /// guide) or among the system groups (the project's reference).
    pub fn k8s_info(&self) -> Option<&Group<K8sInfo<'a>>> {
        self.neuron_k8s_info.as_ref().or_else(|| self.system_data.as_ref()?.neuron_k8s_info.as_ref())
    }

    pub fn parse(line: &'a str) -> Result<Self, ReportError> {
        match serde_json::from_str(line) {
            Ok(report) => Ok(report),
            Err(_) => {
                let _lenient = LenientScope::enter();
                Ok(serde_json::from_str(line)?)
            }
        }
    }

    /// [`Report::parse`] at a quarter less of its cost on a large report: the loaded
    /// models' text, most of the bytes, is delimited by a bracket scan and left out of
    /// what serde reads (a copy of the rest in `buffer`, kept for the next line). It is
    /// checked only when read ([`MemoryUsed::loaded_models`]), so a malformed one costs
    /// its runtime's models, not the report.
    pub fn parse_reusing(line: &'a str, buffer: &'a mut String) -> Result<Self, ReportError> {
        let Some(cuts) = cut::cut_loaded_models(line, buffer) else {
            return Report::parse(line);
        };
        let copy: &'a str = buffer;
        let mut report = Report::parse(copy)?;
        report.put_back_loaded_models(line, copy, &cuts);
        Ok(report)
    }

    /// Replaces each runtime's `loaded_models` placeholder, left in `copy` by
    /// [`cut::cut_loaded_models`], with the text it stands for. Known by where it is, not
    /// by what it says: a number the line itself gives there (under a key the cut did not
    /// take, written with a space or an escape) stays what it is.
    fn put_back_loaded_models(&mut self, line: &'a str, copy: &str, cuts: &[cut::Cut]) {
        let memories = self.neuron_runtime_data.items.iter_mut().filter_map(|item| match item {
            Item::Ok(RuntimeEntry {
                report: Some(RuntimeGroups { memory_used: Some(Group::Ok(memory)), .. }), ..
            }) => Some(memory),
            _ => None,
        });
        for memory in memories {
            let Some(text) = memory.loaded_models else { continue };
            let at = text.as_ptr().addr().wrapping_sub(copy.as_ptr().addr());
            if let Ok(i) = cuts.binary_search_by_key(&at, |cut| cut.placeholder) {
                memory.loaded_models = Some(&line[cuts[i].text.clone()]);
            }
        }
    }
}

// --- Groups ------------------------------------------------------------------------

/// A metric group as reported: its data, neuron-monitor's own error for it, or the
/// reason the agent could not read it.
#[derive(Debug, Clone, PartialEq)]
pub enum Group<T> {
    Ok(T),
    /// neuron-monitor set the group's `error`: its data must not be read.
    Error(String),
    /// The group's JSON did not have the documented shape.
    Malformed(String),
}

impl<T> Group<T> {
    pub fn ok(&self) -> Option<&T> {
        match self {
            Group::Ok(t) => Some(t),
            _ => None,
        }
    }

    /// The problem with this group, if any.
    pub fn problem(&self) -> Option<&str> {
        match self {
            Group::Ok(_) => None,
            Group::Error(e) | Group::Malformed(e) => Some(e),
        }
    }
}

/// Every group body carries neuron-monitor's `error` string.
pub trait GroupBody {
    fn error(&self) -> &str;
}

/// An entry of an array (a runtime) that is read on its own in lenient mode.
#[derive(Debug, Clone, PartialEq)]
pub enum Item<T> {
    Ok(T),
    Malformed(String),
}

thread_local! {
    // Set while `Report::parse` re-reads a document that failed the strict pass.
    static LENIENT: Cell<bool> = const { Cell::new(false) };
}

struct LenientScope;

impl LenientScope {
    fn enter() -> Self {
        LENIENT.with(|l| l.set(true));
        LenientScope
    }
}

impl Drop for LenientScope {
    fn drop(&mut self) {
        LENIENT.with(|l| l.set(false));
    }
}

fn lenient() -> bool {
    LENIENT.with(|l| l.get())
}

/// In lenient mode, captures the value's raw text and parses it on its own, so that a
/// failure stays inside this value.
fn read_isolated<'de, D, T>(deserializer: D) -> Result<Result<T, String>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    if lenient() {
        let raw: &'de RawValue = Deserialize::deserialize(deserializer)?;
        Ok(serde_json::from_str(raw.get()).map_err(|e| e.to_string()))
    } else {
        T::deserialize(deserializer).map(Ok)
    }
}

impl<'de, T: Deserialize<'de> + GroupBody> Deserialize<'de> for Group<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(match read_isolated::<D, T>(deserializer)? {
            Ok(body) if body.error().is_empty() => Group::Ok(body),
            Ok(body) => Group::Error(body.error().to_owned()),
            Err(reason) => Group::Malformed(reason),
        })
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Item<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(match read_isolated::<D, T>(deserializer)? {
            Ok(item) => Item::Ok(item),
            Err(reason) => Item::Malformed(reason),
        })
    }
}

/// A JSON array read up to `LIMIT` entries: later entries are skipped unread (valid JSON,
/// not kept), so an array of any length costs at most `LIMIT` entries of memory. Null
/// reads as empty.
#[derive(Debug, Clone, PartialEq)]
pub struct Capped<T, const LIMIT: usize> {
    pub items: Vec<T>,
    /// Entries after the first `LIMIT`, skipped.
    pub skipped: usize,
}

impl<T, const LIMIT: usize> Default for Capped<T, LIMIT> {
    fn default() -> Self {
        Capped { items: Vec::new(), skipped: 0 }
    }
}

impl<T, const LIMIT: usize> std::ops::Deref for Capped<T, LIMIT> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        &self.items
    }
}

impl<'de, T: Deserialize<'de>, const LIMIT: usize> Deserialize<'de> for Capped<T, LIMIT> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct CappedVisitor<T, const LIMIT: usize>(PhantomData<T>);

        impl<'de, T: Deserialize<'de>, const LIMIT: usize> Visitor<'de> for CappedVisitor<T, LIMIT> {
            type Value = Capped<T, LIMIT>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array or null")
            }

            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Capped::default())
            }

            fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Capped::default())
            }

            fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
                deserializer.deserialize_seq(self)
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                // Never trust a size hint from the input for an allocation.
                let mut capped = Capped { items: Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64)), skipped: 0 };
                while capped.items.len() < LIMIT {
                    match seq.next_element()? {
                        Some(item) => capped.items.push(item),
                        None => return Ok(capped),
                    }
                }
                while seq.next_element::<de::IgnoredAny>()?.is_some() {
                    capped.skipped += 1;
                }
                Ok(capped)
            }
        }

        deserializer.deserialize_option(CappedVisitor(PhantomData))
    }
}

macro_rules! group_body {
    ($($ty:ident$(<$lt:lifetime>)?),* $(,)?) => {$(
        impl$(<$lt>)? GroupBody for $ty$(<$lt>)? {
            fn error(&self) -> &str {
                &self.error
            }
        }
    )*};
}

group_body!(
    NeuroncoreCounters<'a>,
    MemoryUsed<'a>,
    RuntimeVcpuUsage<'a>,
    ExecutionStats<'a>,
    SystemVcpuUsage<'a>,
    MemoryInfo<'a>,
    HwCounters<'a>,
    InstanceInfo<'a>,
    HardwareInfo<'a>,
    K8sInfo<'a>,
);

/// A string borrowed from the line where it has no escapes (serde's own `Cow` always
/// copies): object keys and names, read without an allocation each.
struct Text<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TextVisitor;

        impl<'de> Visitor<'de> for TextVisitor {
            type Value = Text<'de>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }

            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Borrowed(v)))
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v.to_owned())))
            }
        }

        deserializer.deserialize_str(TextVisitor)
    }
}

// --- Objects keyed by indices ("0", "1", …) or names ---------------------------------

/// A JSON object read as its entries in document order, with keys parsed as `K`:
/// cheaper than a hash map for the few dozen entries a report has.
#[derive(Debug, Clone, PartialEq)]
pub struct Keyed<K, T>(pub Vec<(K, T)>);

/// An object keyed by decimal indices (NeuronCores, vCPUs).
pub type IndexMap<T> = Keyed<u32, T>;

impl<K, T> Default for Keyed<K, T> {
    fn default() -> Self {
        Keyed(Vec::new())
    }
}

impl<K: Copy + PartialEq, T> Keyed<K, T> {
    pub fn iter(&self) -> impl Iterator<Item = (K, &T)> {
        self.0.iter().map(|(k, t)| (*k, t))
    }

    pub fn get(&self, key: K) -> Option<&T> {
        self.0.iter().find(|(k, _)| *k == key).map(|(_, t)| t)
    }
}

impl<K, T> Keyed<K, T> {
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<'de, K: FromStr, T: Deserialize<'de>> Deserialize<'de> for Keyed<K, T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyedVisitor<K, T>(PhantomData<(K, T)>);

        impl<'de, K: FromStr, T: Deserialize<'de>> Visitor<'de> for KeyedVisitor<K, T> {
            type Value = Keyed<K, T>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(8));
                while let Some(Text(key)) = map.next_key()? {
                    let key = key.parse().map_err(|_| de::Error::custom(format!("unexpected key {key:?}")))?;
                    entries.push((key, map.next_value()?));
                }
                Ok(Keyed(entries))
            }
        }

        deserializer.deserialize_map(KeyedVisitor(PhantomData))
    }
}

// --- Runtime entries -----------------------------------------------------------------

/// One monitored Neuron application.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct RuntimeEntry<'a> {
    pub pid: Option<u32>,
    /// `NEURON_PROCESS_TAG` of the application, or its PID when unset.
    #[serde(borrow)]
    pub neuron_runtime_tag: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub address: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub error: Cow<'a, str>,
    #[serde(borrow)]
    pub report: Option<RuntimeGroups<'a>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct RuntimeGroups<'a> {
    #[serde(borrow)]
    pub neuroncore_counters: Option<Group<NeuroncoreCounters<'a>>>,
    #[serde(borrow)]
    pub memory_used: Option<Group<MemoryUsed<'a>>>,
    #[serde(borrow)]
    pub neuron_runtime_vcpu_usage: Option<Group<RuntimeVcpuUsage<'a>>>,
    #[serde(borrow, alias = "inference_stats")]
    pub execution_stats: Option<Group<ExecutionStats<'a>>>,
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct NeuroncoreCounters<'a> {
    pub period: Option<f64>,
    #[serde(borrow)]
    pub error: Cow<'a, str>,
    /// Every core of the host, including cores this runtime does not own (zeros).
    pub neuroncores_in_use: Option<IndexMap<CoreCounters>>,
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct CoreCounters {
    /// Percent over the period.
    pub neuroncore_utilization: Option<f64>,
    pub flops: Option<f64>,
    /// Newer releases; sometimes without `flops`.
    pub effective_flops: Option<f64>,
    /// Trn2 with logical NeuronCores: the physical cores of this logical one.
    pub v3d: Option<V3d>,
}

/// The physical cores of a logical NeuronCore, keyed by their index within it. Read from
/// `"nc_v3": {"0": …, "1": …}`, or from one key per physical core numbered across the
/// host (`"nc_v3.2": …, "nc_v3.3": …`, the shape of AWS's user guide), taken in the order
/// of those numbers.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct V3d {
    pub nc_v3: Option<IndexMap<PhysicalCoreCounters>>,
}

impl<'de> Deserialize<'de> for V3d {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V3dVisitor;

        impl<'de> Visitor<'de> for V3dVisitor {
            type Value = V3d;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object of physical cores")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut within: Option<IndexMap<PhysicalCoreCounters>> = None;
                let mut numbered: Vec<(u32, PhysicalCoreCounters)> = Vec::new();
                while let Some(Text(key)) = map.next_key()? {
                    if key == "nc_v3" {
                        within = map.next_value()?;
                    } else if let Some(n) = key.strip_prefix("nc_v3.").and_then(|n| n.parse::<u32>().ok()) {
                        numbered.push((n, map.next_value()?));
                    } else {
                        map.next_value::<de::IgnoredAny>()?;
                    }
                }
                if within.is_none() && !numbered.is_empty() {
                    numbered.sort_by_key(|(n, _)| *n);
                    within = Some(Keyed(numbered.into_iter().enumerate().map(|(i, (_, c))| (i as u32, c)).collect()));
                }
                Ok(V3d { nc_v3: within })
            }
        }

        deserializer.deserialize_map(V3dVisitor)
    }
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Deserialize)]
#[serde(default)]
pub struct PhysicalCoreCounters {
    /// Percent over the period.
    pub neuroncore_utilization: Option<f64>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default)]
pub struct MemoryUsed<'a> {
    pub period: Option<f64>,
    #[serde(borrow)]
    pub error: Cow<'a, str>,
    pub neuron_runtime_used_bytes: Option<RuntimeUsedBytes>,
    /// Kept as JSON text: most of a report's bytes, read only on demand
    /// ([`MemoryUsed::loaded_models`]; the node state reads it only when it changed).
    #[serde(borrow, deserialize_with = "json_text")]
    pub loaded_models: Option<&'a str>,
}

/// A value's JSON text, unparsed; none for null.
fn json_text<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<&'de str>, D::Error> {
    Ok(Option::<&'de RawValue>::deserialize(deserializer)?.map(RawValue::get))
}

impl<'a> MemoryUsed<'a> {
    /// The first [`MAX_LOADED_MODELS_PER_RUNTIME`] models (their subgraphs kept raw), the
    /// others skipped unread and counted; none when absent or null.
    pub fn loaded_models(
        &self,
    ) -> Result<Capped<Item<LoadedModel<'a>>, MAX_LOADED_MODELS_PER_RUNTIME>, serde_json::Error> {
        match self.loaded_models {
            Some(text) => serde_json::from_str(text),
            None => Ok(Capped::default()),
        }
    }
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct RuntimeUsedBytes {
    pub host: Option<f64>,
    pub neuron_device: Option<f64>,
    pub usage_breakdown: Option<UsageBreakdown>,
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct UsageBreakdown {
    pub host: Option<HostMemory>,
    /// Host core index → memory held on that core. Non-zero means the core is held.
    pub neuroncore_memory_usage: Option<IndexMap<CoreMemory>>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Deserialize)]
#[serde(default)]
pub struct HostMemory {
    pub application_memory: Option<f64>,
    pub constants: Option<f64>,
    pub dma_buffers: Option<f64>,
    pub tensors: Option<f64>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Deserialize)]
#[serde(default)]
pub struct CoreMemory {
    pub constants: Option<f64>,
    pub model_code: Option<f64>,
    pub model_shared_scratchpad: Option<f64>,
    pub runtime_memory: Option<f64>,
    pub tensors: Option<f64>,
}

impl CoreMemory {
    /// The five categories in the order of the exported metric names.
    pub fn values(&self) -> [Option<f64>; 5] {
        [self.constants, self.model_code, self.model_shared_scratchpad, self.runtime_memory, self.tensors]
    }

    pub fn is_held(&self) -> bool {
        self.values().iter().any(|v| v.is_some_and(|v| v != 0.0))
    }
}

/// One model a runtime loaded.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default)]
pub struct LoadedModel<'a> {
    #[serde(borrow)]
    pub name: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub uuid: Option<Cow<'a, str>>,
    pub model_id: Option<u64>,
    /// Whether the model is started (executing), as opposed to only loaded.
    pub is_running: Option<bool>,
    /// Kept raw: most of a report's bytes, read only on demand ([`LoadedModel::subgraphs`]).
    #[serde(borrow)]
    pub subgraphs: Option<&'a RawValue>,
}

impl LoadedModel<'_> {
    /// Subgraph name → placement and memory.
    pub fn subgraphs(&self) -> Result<Keyed<String, Subgraph>, serde_json::Error> {
        match self.subgraphs {
            Some(raw) => Ok(Option::<Keyed<String, Subgraph>>::deserialize(raw)?.unwrap_or_default()),
            None => Ok(Keyed::default()),
        }
    }
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct Subgraph {
    pub memory_used_bytes: Option<SubgraphMemory>,
    /// Counts within the cores visible to the runtime: NOT a host core index.
    pub neuroncore_index: Option<u32>,
    pub neuron_device_index: Option<u32>,
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct SubgraphMemory {
    pub host: Option<f64>,
    pub neuron_device: Option<f64>,
    pub usage_breakdown: Option<SubgraphBreakdown>,
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct SubgraphBreakdown {
    pub host: Option<HostMemory>,
    pub neuron_device: Option<DeviceMemory>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Deserialize)]
#[serde(default)]
pub struct DeviceMemory {
    pub constants: Option<f64>,
    pub model_code: Option<f64>,
    pub runtime_memory: Option<f64>,
    pub tensors: Option<f64>,
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct RuntimeVcpuUsage<'a> {
    pub period: Option<f64>,
    #[serde(borrow)]
    pub error: Cow<'a, str>,
    pub vcpu_usage: Option<UserSystem>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Deserialize)]
#[serde(default)]
pub struct UserSystem {
    pub user: Option<f64>,
    pub system: Option<f64>,
}

/// Counts for the captured period, not cumulative.
#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct ExecutionStats<'a> {
    pub period: Option<f64>,
    #[serde(borrow)]
    pub error: Cow<'a, str>,
    /// Executions that failed, by error type.
    #[serde(borrow)]
    pub error_summary: Option<Named<'a, ErrorTypes>>,
    /// Executions by outcome.
    #[serde(borrow)]
    pub execution_summary: Option<Named<'a, StatusTypes>>,
    #[serde(borrow)]
    pub latency_stats: Option<LatencyStats<'a>>,
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct LatencyStats<'a> {
    /// `None` when nothing completed in the period.
    #[serde(borrow)]
    pub total_latency: Option<Percentiles<'a>>,
    #[serde(borrow)]
    pub device_latency: Option<Percentiles<'a>>,
}

/// Latency percentiles in seconds, by name (`p50`, …).
pub type Percentiles<'a> = Named<'a, PercentileNames>;

// --- Objects of named numbers ----------------------------------------------------------

/// The names neuron-monitor documents for one kind of object of named numbers.
pub trait DocumentedNames {
    const NAMES: &'static [&'static str];
}

/// `error_summary`'s error types.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ErrorTypes;

impl DocumentedNames for ErrorTypes {
    const NAMES: &'static [&'static str] = &["generic", "numerical", "transient", "model", "runtime", "hardware"];
}

/// `execution_summary`'s outcomes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StatusTypes;

impl DocumentedNames for StatusTypes {
    const NAMES: &'static [&'static str] = &[
        "completed",
        "completed_with_err",
        "completed_with_num_err",
        "timed_out",
        "incorrect_input",
        "failed_to_queue",
    ];
}

/// The percentiles of `total_latency` and `device_latency`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PercentileNames;

impl DocumentedNames for PercentileNames {
    const NAMES: &'static [&'static str] = &["p0", "p1", "p25", "p50", "p75", "p99", "p100"];
}

/// The name of one value: one neuron-monitor documents, or one a newer release added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Name<'a> {
    Documented(&'static str),
    Other(Cow<'a, str>),
}

impl Name<'_> {
    pub fn as_str(&self) -> &str {
        match self {
            Name::Documented(name) => name,
            Name::Other(name) => name,
        }
    }

    /// The name, owned only when it is not a documented one.
    pub fn to_static(&self) -> Cow<'static, str> {
        match self {
            Name::Documented(name) => Cow::Borrowed(name),
            Name::Other(name) => Cow::Owned(name.as_ref().to_owned()),
        }
    }
}

/// An object of named numbers (`error_summary`, `execution_summary`, a latency's
/// percentiles) as reported: each documented name it carries and up to
/// [`MAX_UNDOCUMENTED_NAMES`] others, in document order, with its number. A null value
/// is absent, as is a name the object does not carry: nothing is made up. Refused and
/// counted in `refused`: other names beyond that bound or not [`is_value_name`], a name
/// given twice, a value that is not a number (so one odd value never costs the group).
#[derive(Debug, Clone, PartialEq)]
pub struct Named<'a, K> {
    pub entries: Vec<(Name<'a>, f64)>,
    pub refused: u32,
    names: PhantomData<K>,
}

impl<K> Default for Named<'_, K> {
    fn default() -> Self {
        Named { entries: Vec::new(), refused: 0, names: PhantomData }
    }
}

impl<'a, K> Named<'a, K> {
    /// The value of `name`, if the object carries it.
    pub fn get(&self, name: &str) -> Option<f64> {
        self.entries.iter().find(|(n, _)| n.as_str() == name).map(|(_, v)| *v)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Name<'a>, f64)> {
        self.entries.iter().map(|(n, v)| (n, *v))
    }
}

/// A name a newer neuron-monitor may add that the agent takes as a label value: 1 to
/// [`MAX_VALUE_NAME_BYTES`] bytes of ASCII letters, digits, `_`, `.` and `-`.
pub fn is_value_name(name: &str) -> bool {
    (1..=MAX_VALUE_NAME_BYTES).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// One value of a [`Named`] object.
enum NamedValue {
    Number(f64),
    Null,
    /// A string, a boolean, an object or an array: skipped whole.
    Other,
}

impl<'de> Deserialize<'de> for NamedValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = NamedValue;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
                Ok(NamedValue::Number(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(NamedValue::Number(v as f64))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(NamedValue::Number(v as f64))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(NamedValue::Null)
            }
            fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(NamedValue::Null)
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(NamedValue::Other)
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
                Ok(NamedValue::Other)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                while map.next_entry::<de::IgnoredAny, de::IgnoredAny>()?.is_some() {}
                Ok(NamedValue::Other)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                while seq.next_element::<de::IgnoredAny>()?.is_some() {}
                Ok(NamedValue::Other)
            }
        }
        deserializer.deserialize_any(V)
    }
}

impl<'de: 'a, 'a, K: DocumentedNames> Deserialize<'de> for Named<'a, K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NamedVisitor<K>(PhantomData<K>);

        impl<'de, K: DocumentedNames> Visitor<'de> for NamedVisitor<K> {
            type Value = Named<'de, K>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object of numbers")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut named = Named { entries: Vec::with_capacity(K::NAMES.len()), ..Named::default() };
                let mut undocumented = 0;
                while let Some(Text(key)) = map.next_key()? {
                    let value = match map.next_value()? {
                        NamedValue::Number(v) => v,
                        NamedValue::Null => continue,
                        NamedValue::Other => {
                            named.refused += 1;
                            continue;
                        }
                    };
                    if named.entries.iter().any(|(n, _)| n.as_str() == key) {
                        named.refused += 1;
                        continue;
                    }
                    let name = match K::NAMES.iter().find(|n| **n == key) {
                        Some(documented) => Name::Documented(documented),
                        None if undocumented < MAX_UNDOCUMENTED_NAMES && is_value_name(&key) => {
                            undocumented += 1;
                            Name::Other(key)
                        }
                        None => {
                            named.refused += 1;
                            continue;
                        }
                    };
                    named.entries.push((name, value));
                }
                Ok(named)
            }
        }

        deserializer.deserialize_map(NamedVisitor(PhantomData))
    }
}

// --- System groups -------------------------------------------------------------------

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct SystemData<'a> {
    #[serde(borrow)]
    pub vcpu_usage: Option<Group<SystemVcpuUsage<'a>>>,
    #[serde(borrow)]
    pub memory_info: Option<Group<MemoryInfo<'a>>>,
    #[serde(borrow)]
    pub neuron_hw_counters: Option<Group<HwCounters<'a>>>,
    /// Where the project's reference places it; see [`Report::k8s_info`].
    #[serde(borrow)]
    pub neuron_k8s_info: Option<Group<K8sInfo<'a>>>,
}

/// `neuron_k8s_info`: the pod, namespace and containers neuron-monitor sees on each core
/// and device (EKS only; off unless its configuration asks for it). Its `error` is set
/// where the kubelet's information is not reachable.
#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct K8sInfo<'a> {
    pub period: Option<f64>,
    #[serde(borrow)]
    pub error: Cow<'a, str>,
    /// Host core index → who uses it.
    #[serde(borrow)]
    pub neuroncores_k8s_info: Option<IndexMap<K8sOwner<'a>>>,
    /// Device index → who uses it.
    #[serde(borrow)]
    pub neurondevices_k8s_info: Option<IndexMap<K8sOwner<'a>>>,
}

/// The workload using one core or device.
#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct K8sOwner<'a> {
    #[serde(borrow)]
    pub pod_name: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub namespace: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub container_name: Option<Containers<'a>>,
}

/// Container names: a list in the documented format, a single name read as a list of
/// one. The first [`MAX_K8S_CONTAINERS_PER_ENTRY`] are kept, the others counted.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Containers<'a> {
    pub names: Vec<Cow<'a, str>>,
    pub skipped: usize,
}

impl<'de: 'a, 'a> Deserialize<'de> for Containers<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ContainersVisitor;

        impl<'de> Visitor<'de> for ContainersVisitor {
            type Value = Containers<'de>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of container names or one name")
            }

            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Containers { names: vec![Cow::Borrowed(v)], skipped: 0 })
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Containers { names: vec![Cow::Owned(v.to_owned())], skipped: 0 })
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut containers = Containers::default();
                while containers.names.len() < MAX_K8S_CONTAINERS_PER_ENTRY {
                    match seq.next_element::<Text<'de>>()? {
                        Some(Text(name)) => containers.names.push(name),
                        None => return Ok(containers),
                    }
                }
                while seq.next_element::<de::IgnoredAny>()?.is_some() {
                    containers.skipped += 1;
                }
                Ok(containers)
            }
        }

        deserializer.deserialize_any(ContainersVisitor)
    }
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct SystemVcpuUsage<'a> {
    pub period: Option<f64>,
    #[serde(borrow)]
    pub error: Cow<'a, str>,
    pub average_usage: Option<CpuUsage>,
    /// vCPU index → usage; its length is the host's vCPU count.
    pub usage_data: Option<IndexMap<CpuUsage>>,
    pub context_switch_count: Option<f64>,
}

/// Percentages of one vCPU (or their average).
#[derive(Debug, Default, Clone, Copy, PartialEq, Deserialize)]
#[serde(default)]
pub struct CpuUsage {
    pub user: Option<f64>,
    pub nice: Option<f64>,
    pub system: Option<f64>,
    pub idle: Option<f64>,
    pub io_wait: Option<f64>,
    pub irq: Option<f64>,
    pub soft_irq: Option<f64>,
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct MemoryInfo<'a> {
    pub period: Option<f64>,
    #[serde(borrow)]
    pub error: Cow<'a, str>,
    pub memory_total_bytes: Option<f64>,
    pub memory_used_bytes: Option<f64>,
    pub swap_total_bytes: Option<f64>,
    pub swap_used_bytes: Option<f64>,
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct HwCounters<'a> {
    pub period: Option<f64>,
    #[serde(borrow)]
    pub error: Cow<'a, str>,
    /// `None` when the driver is not reachable.
    pub neuron_devices: Option<Vec<DeviceEccCounters>>,
}

/// ECC events of one device during the period.
#[derive(Debug, Default, Clone, Copy, PartialEq, Deserialize)]
#[serde(default)]
pub struct DeviceEccCounters {
    pub neuron_device_index: Option<u32>,
    pub mem_ecc_corrected: Option<f64>,
    pub mem_ecc_uncorrected: Option<f64>,
    pub sram_ecc_corrected: Option<f64>,
    pub sram_ecc_uncorrected: Option<f64>,
}

impl DeviceEccCounters {
    pub const KINDS: [&'static str; 4] =
        ["mem_ecc_corrected", "mem_ecc_uncorrected", "sram_ecc_corrected", "sram_ecc_uncorrected"];

    pub fn values(&self) -> [Option<f64>; 4] {
        [self.mem_ecc_corrected, self.mem_ecc_uncorrected, self.sram_ecc_corrected, self.sram_ecc_uncorrected]
    }
}

// --- Always-present objects ----------------------------------------------------------

#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct InstanceInfo<'a> {
    #[serde(borrow)]
    pub instance_name: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub instance_id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub instance_type: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub instance_availability_zone: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub instance_availability_zone_id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub instance_region: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub ami_id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub subnet_id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub error: Cow<'a, str>,
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct HardwareInfo<'a> {
    pub neuron_device_count: Option<u32>,
    pub neuroncore_per_device_count: Option<u32>,
    #[serde(borrow)]
    pub error: Cow<'a, str>,
    #[serde(borrow)]
    pub neuron_device_version: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub neuroncore_version: Option<Cow<'a, str>>,
    /// For example `inferentia2`.
    #[serde(borrow)]
    pub neuron_device_type: Option<Cow<'a, str>>,
    pub neuron_device_memory_size: Option<f64>,
    /// trn2: physical cores grouped into each logical core (a number or a string).
    #[serde(borrow)]
    pub logical_neuroncore_config: Option<NumberOrText<'a>>,
}

impl HardwareInfo<'_> {
    /// NeuronCores on the host, when both counts are known.
    pub fn core_count(&self) -> Option<u32> {
        self.neuron_device_count?.checked_mul(self.neuroncore_per_device_count?)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum NumberOrText<'a> {
    Number(f64),
    Text(Cow<'a, str>),
}

impl<'de: 'a, 'a> Deserialize<'de> for NumberOrText<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = NumberOrText<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a number or a string")
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
                Ok(NumberOrText::Number(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(NumberOrText::Number(v as f64))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(NumberOrText::Number(v as f64))
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(NumberOrText::Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(NumberOrText::Text(Cow::Owned(v.to_owned())))
            }
        }
        deserializer.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests;
