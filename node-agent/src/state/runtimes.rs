//! The runtimes of a report into the node state: each entry matched with the runtime it
//! was in the previous report (by exported tag), its groups applied, its held cores
//! derived.

use std::{collections::HashMap, sync::Arc};

use api::{
    limits::{MAX_CORE_ENTRIES_PER_REPORT, MAX_LOADED_MODELS_PER_RUNTIME, MAX_MODEL_INFO_PER_RUNTIME, MAX_NEURONCORES},
    report::{Capped, Group, Item, LoadedModel, MemoryUsed, Report, RuntimeEntry, RuntimeGroups},
};

use super::{
    label_value, truncated, GroupProblem, HeldCore, LoadedModels, ModelInfo, NamedValues, NodeState, PhysicalCores,
    ProblemKind, Refusals, RuntimeLabels, RuntimeState, MAX_PROBLEM_MESSAGE_BYTES,
};

impl NodeState {
    pub(super) fn apply_runtimes(&mut self, report: &Report<'_>) {
        self.refusals.runtimes = report.neuron_runtime_data.skipped as u64;
        // By tag, for a lookup per entry; a tag held twice (same tag and PID) keeps both.
        let mut previous: HashMap<String, Vec<RuntimeState>> = HashMap::with_capacity(self.runtimes.len());
        for state in std::mem::take(&mut self.runtimes) {
            previous.entry(state.labels.runtime_tag.clone()).or_default().push(state);
        }
        let entries: Vec<&RuntimeEntry<'_>> = report
            .neuron_runtime_data
            .iter()
            .filter_map(|item| match item {
                Item::Ok(rt) => Some(rt),
                Item::Malformed(reason) => {
                    self.problems.push(GroupProblem {
                        group: "neuron_runtime_data",
                        runtime_tag: String::new(),
                        kind: ProblemKind::Malformed,
                        message: truncated(reason, MAX_PROBLEM_MESSAGE_BYTES).to_owned(),
                    });
                    None
                }
            })
            .collect();
        let tags = runtime_tags(&entries, &mut self.refusals.label_values);
        let mut budget = CoreEntries { left: MAX_CORE_ENTRIES_PER_REPORT, refused: 0 };
        let mut current = Vec::with_capacity(entries.len());
        for (entry, tag) in entries.into_iter().zip(tags) {
            let mut state = match previous.get_mut(&tag).and_then(Vec::pop) {
                Some(state) => state,
                None => RuntimeState::new(Arc::new(RuntimeLabels {
                    instance: self.instance.clone(),
                    runtime_tag: tag,
                    pod: None,
                    ecs: None,
                })),
            };
            state.pid = entry.pid;
            if !entry.error.is_empty() {
                let problem = Group::<()>::Error(entry.error.to_string());
                self.note("neuron_runtime", &state.labels.runtime_tag, &problem);
            }
            if let Some(groups) = &entry.report {
                self.apply_runtime_groups(&mut state, groups, &mut budget);
            }
            state.compute_cores();
            current.push(state);
        }
        current.sort_by(|a, b| a.labels.runtime_tag.cmp(&b.labels.runtime_tag));
        self.runtimes = current;
        self.refusals.core_entries = budget.refused;
    }

    /// The groups of one runtime's report into its state; a group missing from the report
    /// keeps its last values.
    fn apply_runtime_groups(&mut self, state: &mut RuntimeState, groups: &RuntimeGroups<'_>, budget: &mut CoreEntries) {
        let tag = state.labels.runtime_tag.clone();
        if let Some(g) = &groups.neuroncore_counters {
            self.note("neuroncore_counters", &tag, g);
            let refused = &mut self.refusals.core_indices;
            state.utilization = g.ok().map(|c| {
                let cores = c.neuroncores_in_use.iter().flat_map(|m| m.iter());
                by_core(cores, refused, budget, |c| c.neuroncore_utilization.filter(|u| *u != 0.0))
            });
            // The same cores again: their refusals are counted once, above.
            let cores = || g.ok().into_iter().flat_map(|c| c.neuroncores_in_use.iter().flat_map(|m| m.iter()));
            let finite = |v: Option<f64>| v.filter(|f| f.is_finite() && *f >= 0.0);
            state.flops = by_core(cores(), &mut 0, budget, |c| {
                let flops = [finite(c.flops), finite(c.effective_flops)];
                flops.iter().any(Option::is_some).then_some(flops)
            });
            state.physical = by_core(cores(), &mut 0, budget, |c| {
                let mut physical: PhysicalCores = Default::default();
                for (n, p) in c.v3d.as_ref()?.nc_v3.as_ref()?.iter() {
                    if let Some(slot) = physical.get_mut(n as usize) {
                        *slot = Some(finite(p.neuroncore_utilization).unwrap_or(0.0));
                    }
                }
                physical.iter().any(Option::is_some).then_some(physical)
            });
        }
        if let Some(g) = &groups.memory_used {
            self.note("memory_used", &tag, g);
            let used = g.ok().and_then(|m| m.neuron_runtime_used_bytes.as_ref());
            state.memory_used = used.map(|u| [u.host, u.neuron_device]);
            match g.ok() {
                Some(memory) => {
                    let models = state.models.get_or_insert_with(LoadedModels::default);
                    models.update(memory, &mut self.refusals);
                }
                None => state.models = None,
            }
            let refused = &mut self.refusals.core_indices;
            state.core_memory = g.ok().map(|_| {
                let cores = used
                    .and_then(|u| u.usage_breakdown.as_ref())
                    .and_then(|b| b.neuroncore_memory_usage.as_ref())
                    .into_iter()
                    .flat_map(|m| m.iter());
                by_core(cores, refused, budget, |c| c.is_held().then_some(*c))
            });
        }
        if let Some(g) = &groups.neuron_runtime_vcpu_usage {
            self.note("neuron_runtime_vcpu_usage", &tag, g);
            state.vcpu = g.ok().and_then(|v| v.vcpu_usage).map(|v| [v.user, v.system]);
        }
        if let Some(g) = &groups.execution_stats {
            self.note("execution_stats", &tag, g);
            match g.ok() {
                Some(stats) => {
                    let refused = &mut self.refusals.value_names;
                    let errors = state.errors_total.get_or_insert_with(NamedValues::default);
                    if let Some(counts) = &stats.error_summary {
                        *refused += u64::from(counts.refused);
                        errors.add(counts, refused);
                    }
                    let status = state.status_total.get_or_insert_with(NamedValues::default);
                    if let Some(counts) = &stats.execution_summary {
                        *refused += u64::from(counts.refused);
                        status.add(counts, refused);
                    }
                    let latency = stats.latency_stats.as_ref();
                    for (percentiles, values) in [
                        (latency.and_then(|l| l.total_latency.as_ref()), &mut state.latency),
                        (latency.and_then(|l| l.device_latency.as_ref()), &mut state.device_latency),
                    ] {
                        match percentiles {
                            Some(p) => {
                                *refused += u64::from(p.refused);
                                values.get_or_insert_with(NamedValues::default).set(p);
                            }
                            None => *values = None,
                        }
                    }
                }
                None => (state.latency, state.device_latency) = (None, None),
            }
        }
    }
}

impl RuntimeState {
    fn new(labels: Arc<RuntimeLabels>) -> Self {
        RuntimeState {
            labels,
            pid: None,
            cores: Vec::new(),
            memory_used: None,
            models: None,
            vcpu: None,
            latency: None,
            device_latency: None,
            errors_total: None,
            status_total: None,
            utilization: None,
            flops: Vec::new(),
            physical: Vec::new(),
            physical_cores: Vec::new(),
            core_memory: None,
        }
    }

    /// Held cores: those with memory on them or non-zero utilization. Both lists are
    /// sorted by core without duplicates ([`by_core`]): one merge pass.
    fn compute_cores(&mut self) {
        self.cores.clear();
        self.physical_cores.clear();
        let utilization = self.utilization.as_deref();
        let memory = self.core_memory.as_deref();
        let mut busy = utilization.unwrap_or_default().iter().peekable();
        let mut loaded = memory.unwrap_or_default().iter().peekable();
        loop {
            let index = match (busy.peek(), loaded.peek()) {
                (None, None) => break,
                (Some((b, _)), None) => *b,
                (None, Some((l, _))) => *l,
                (Some((b, _)), Some((l, _))) => (*b).min(*l),
            };
            let u = busy.next_if(|(i, _)| *i == index).map(|(_, v)| *v);
            let m = loaded.next_if(|(i, _)| *i == index).map(|(_, v)| *v);
            let flops = self.flops.binary_search_by_key(&index, |(i, _)| *i).map_or([None; 2], |i| self.flops[i].1);
            if let Ok(i) = self.physical.binary_search_by_key(&index, |(i, _)| *i) {
                let physical = &self.physical[i].1;
                // Physical cores are numbered within their logical core: the host's index
                // counts them across logical cores.
                let per_logical = physical.iter().rposition(Option::is_some).map_or(1, |n| n as u32 + 1);
                for (n, u) in physical.iter().enumerate() {
                    if let Some(u) = u {
                        self.physical_cores.push((index, index * per_logical + n as u32, *u));
                    }
                }
            }
            self.cores.push(HeldCore {
                index,
                utilization: utilization.map(|_| u.unwrap_or(0.0)),
                memory: memory.map(|_| m.unwrap_or_default()),
                flops,
            });
        }
    }
}

impl LoadedModels {
    /// The models of a report's `memory_used` group (absent: none loaded), read again
    /// only when their text changed; the refusals of that reading count in every report.
    fn update(&mut self, memory: &MemoryUsed<'_>, refusals: &mut Refusals) {
        let text = memory.loaded_models.unwrap_or_default();
        if self.source.is_empty() || self.source != text {
            match memory.loaded_models() {
                Ok(models) => self.read(&models),
                Err(_) => *self = LoadedModels { refused: (1, 0), ..LoadedModels::default() },
            }
            self.source.clear();
            self.source.push_str(text);
        }
        refusals.loaded_models += self.refused.0;
        refusals.label_values += self.refused.1;
    }

    fn read(&mut self, models: &Capped<Item<LoadedModel<'_>>, MAX_LOADED_MODELS_PER_RUNTIME>) {
        let (mut running, mut idle, mut unknown, mut refused, mut labels) = (0, 0, 0, models.skipped as u64, 0);
        self.info.clear();
        for model in models.iter() {
            let Item::Ok(model) = model else {
                refused += 1;
                continue;
            };
            match model.is_running {
                Some(true) => running += 1,
                Some(false) => idle += 1,
                None => unknown += 1,
            }
            if self.info.len() == MAX_MODEL_INFO_PER_RUNTIME {
                refused += 1;
                continue;
            }
            self.info.push(ModelInfo {
                name: label_value(model.name.as_deref().unwrap_or_default(), &mut labels),
                model_id: model.model_id,
                is_running: model.is_running,
            });
        }
        (self.readable, self.running, self.idle, self.unknown) = (true, running, idle, unknown);
        self.refused = (refused, labels);
    }
}

/// The exported tag of each runtime: its tag (a bounded [`label_value`]), or its PID when
/// the tag is empty (as neuron-monitor does when `NEURON_PROCESS_TAG` is unset). Tags
/// shared by several processes get `@<pid>` on all but the lowest (PID, position), so
/// that no two runtimes export the same series. Linear: one map of each tag's owner.
fn runtime_tags(entries: &[&RuntimeEntry<'_>], refused: &mut u64) -> Vec<String> {
    let base: Vec<String> = entries
        .iter()
        .map(|e| match e.neuron_runtime_tag.as_deref() {
            Some(tag) if !tag.is_empty() => label_value(tag, refused),
            _ => e.pid.map(|p| p.to_string()).unwrap_or_default(),
        })
        .collect();
    let key = |i: usize| (entries[i].pid.unwrap_or(0), i);
    let mut owner: HashMap<&str, (u32, usize)> = HashMap::with_capacity(base.len());
    for (i, tag) in base.iter().enumerate() {
        owner.entry(tag.as_str()).and_modify(|o| *o = (*o).min(key(i))).or_insert(key(i));
    }
    base.iter()
        .enumerate()
        .map(
            |(i, tag)| {
                if owner.get(tag.as_str()) == Some(&key(i)) {
                    tag.clone()
                } else {
                    format!("{tag}@{}", key(i).0)
                }
            },
        )
        .collect()
}

/// The per-core values one report may still keep, over all its runtimes and per-core
/// groups, and those refused: what bounds the per-core series of a report within the
/// accepted line length (each runtime lists every core of the host; only the held ones
/// have values).
struct CoreEntries {
    left: usize,
    refused: u64,
}

/// Per-core values of one runtime: entries whose index is a possible core (others are
/// counted in `refused`) and whose `value` is `Some`, sorted by core, the first entry of
/// a core kept (as a lookup in document order would), while the report's `budget` lasts.
fn by_core<'r, C: 'r, T>(
    entries: impl Iterator<Item = (u32, &'r C)>,
    refused: &mut u64,
    budget: &mut CoreEntries,
    value: impl Fn(&C) -> Option<T>,
) -> Vec<(u32, T)> {
    let mut cores: Vec<(u32, T)> = entries
        .filter(|(index, _)| {
            let possible = *index < MAX_NEURONCORES;
            *refused += u64::from(!possible);
            possible
        })
        .filter_map(|(index, c)| value(c).map(|v| (index, v)))
        .collect();
    cores.sort_by_key(|(index, _)| *index); // stable: the first of a core stays first
    cores.dedup_by_key(|(index, _)| *index);
    let kept = cores.len().min(budget.left);
    budget.refused += (cores.len() - kept) as u64;
    budget.left -= kept;
    cores.truncate(kept);
    cores
}
