//! Limits shared by the operator and the node agent: the largest input either trusts
//! before it sizes an allocation, a label, a request or a ConfigMap, each with the reason
//! for its value. Every limit is documented in docs/ (configuration.md, security.md,
//! health.md, metrics.md), and what it refuses is counted in the binary's own metrics.

// --- neuron-monitor reports, as the node agent reads them ----------------------------
// Real hardware (the reference's table): at most 16 devices (inf1.24xlarge, trn1/trn2)
// and 8 physical cores per device (trn2), 128 cores on the largest node. The limits
// leave room for hardware to come while keeping every per-core or per-device allocation,
// and every exposition, small. Values beyond them come from a broken or hostile
// monitor, never from a node.

/// Neuron devices a report may declare (`neuron_hardware_info.neuron_device_count`);
/// device indices (ECC counters) must be below it.
pub const MAX_NEURON_DEVICES: u32 = 64;

/// NeuronCores per device a report may declare (`neuroncore_per_device_count`).
pub const MAX_NEURONCORES_PER_DEVICE: u32 = 16;

/// NeuronCores of one node: the declared devices × cores per device must not exceed it,
/// and every core index of a report must be below it. 4× trn2's 128 physical cores.
pub const MAX_NEURONCORES: u32 = 512;
/// Physical NeuronCores of one logical core read at most (trn2 groups 2 today).
pub const MAX_PHYSICAL_PER_LOGICAL: u32 = 8;

/// Runtime entries read from one report; later entries are skipped and counted. A real
/// node runs at most a few hundred Neuron applications (one per core at most, 128).
pub const MAX_RUNTIMES_PER_REPORT: usize = 1024;

/// Per-core values (a runtime's held core in one per-core group: utilization, FLOPS,
/// physical cores, core memory) kept from one report, over all its runtimes; later ones
/// are ignored and counted. A core is held by one runtime, so a real report has at most
/// 4 × its cores (512 on a trn2 with LNC=1); without this bound an 8 MiB line of 1,024
/// runtimes each claiming hundreds of cores made ~200,000 series and a 100 MB page.
pub const MAX_CORE_ENTRIES_PER_REPORT: usize = 4096;

/// Names beyond the documented ones that one object of named numbers may add
/// (`error_summary`, `execution_summary`, a latency's percentiles), and that one
/// runtime's running sums keep: newer neuron-monitor releases add a few; a report with
/// more is broken or hostile, and each would be a series (in CloudWatch, a billed metric).
pub const MAX_UNDOCUMENTED_NAMES: usize = 16;

/// Bytes of such a name (its characters: ASCII letters, digits, `_`, `.`, `-`); the
/// documented ones are at most 22.
pub const MAX_VALUE_NAME_BYTES: usize = 64;

/// Models of one runtime's `loaded_models` read; later ones are skipped and counted. A
/// runtime loads a model per core it holds, or a few dozen at most.
pub const MAX_LOADED_MODELS_PER_RUNTIME: usize = 256;

/// Models of one runtime with an info series of their own (`neuron_runtime_loaded_model_info`,
/// for the configs that ask for it); the count by state covers every model read. The runtimes of the recorded 32-runtime
/// trn1n.32xlarge report loaded 20 each.
pub const MAX_MODEL_INFO_PER_RUNTIME: usize = 32;

/// Containers listed for one core or device in `neuron_k8s_info` that are read.
pub const MAX_K8S_CONTAINERS_PER_ENTRY: usize = 8;

/// Bytes of one label value taken from a report (instance fields, runtime tags); longer
/// values are cut at a character boundary. neuron-monitor's longest string, the
/// application tag, is at most 255 characters; AWS identifiers are far shorter.
pub const MAX_REPORT_LABEL_VALUE_BYTES: usize = 256;

// ---------------------------------------------------------------------------------------
// Operator: what configs may add to one node's ConfigMap and to one series.
//
// A node's ConfigMap carries one route per config that matches the node, and the API
// server refuses a ConfigMap whose data exceeds 1 MiB. Without these bounds, one team's
// configs could push every node it selects over that limit, and then no config (not even
// the operator namespace's) would reach those nodes any more. The operator decides per
// node, in a fixed order: configs of the operator's namespace first, then by
// creationTimestamp (oldest first), then namespace and name; a config that does not fit
// on one of its nodes is refused on all of them (never half-applied), so a new config
// never displaces an established one. See `operator/src/render/budget.rs`.
// ---------------------------------------------------------------------------------------

/// Bytes of one config's rendered route (its JSON in `node-config.json`). A realistic
/// config takes 0.3 to 2 KiB; the schema alone lets one reach ~100 KiB (16 tag filters of
/// 1,024 bytes, escaped). Larger: refused as `TooLarge`, naming the largest part.
pub const MAX_CONFIG_RENDERED_BYTES: usize = 16 * 1024;

/// Configs of one namespace on one node. Beyond it: `NamespaceLimit`.
pub const MAX_CONFIGS_PER_NAMESPACE_PER_NODE: usize = 16;

/// Bytes of the routes of one namespace's configs on one node (two configs of the
/// largest size, or 16 ordinary ones). Beyond it: `NamespaceLimit`.
pub const MAX_NAMESPACE_RENDERED_BYTES_PER_NODE: usize = 32 * 1024;

/// Bytes of all routes on one node. With the merged neuron-monitor configuration (its
/// tag filter at most 8 KiB raw, at most ~50 KiB JSON-escaped, stored twice) the data
/// stays below the API server's 1 MiB ConfigMap limit. 24 namespaces at their full
/// budget fit. Beyond it: `NodeLimit`.
pub const MAX_NODE_RENDERED_BYTES: usize = 768 * 1024;

/// Nesting of a YAML text (a `--config` file, the tenancy policy): a NeuronMonitorConfig
/// nests about 10 levels deep; the YAML parser's cost grows with the square of the nesting.
/// Deeper: refused before parsing ([`crate::yaml_nesting`]).
pub const MAX_YAML_NESTING: usize = 64;

/// Configs (routes) on one node: the agent walks every route for every runtime of every
/// report. Beyond it: `NodeLimit`.
pub const MAX_CONFIGS_PER_NODE: usize = 512;

/// Series one config's CloudWatch or OTLP sink may create on one node (CloudWatch
/// metrics of every dimension set and roll-up; OTLP series), as the cost estimate counts
/// them on the largest Neuron node (trn2.48xlarge with one physical core per logical
/// one: 128 NeuronCores, 16 devices) with one application per core. The agent builds,
/// queues and sends each of them every flush, for each config: the default CloudWatch
/// sink takes 2,688 there, the OTLP sink 6,016 (6,144 with `loadedModelInfo`), a config
/// with ten per-core roll-ups ~30,000 (30 PutMetricData requests per node and flush). Beyond it: `TooManySeries`,
/// naming the sink.
pub const MAX_SERIES_PER_CONFIG_PER_NODE: u64 = 10_000;

// --- A NeuronMonitorConfig's fields -----------------------------------------------------
// The schema (`crd`) bounds each field and the validators check the same bound again (a
// config may come from elsewhere than the API server): one number each, here.

/// Entries of `spec.runtimes`.
pub const MAX_RUNTIME_ENTRIES: usize = 16;

/// Extra labels of one config (`spec.sinks.prometheus.extraLabels`) and the characters of
/// one value.
pub const MAX_EXTRA_LABELS: usize = 16;
pub const MAX_LABEL_VALUE_CHARS: usize = 128;

/// Error names that taint (`spec.health.taint.errors`) and the bytes of one (the agent
/// keeps names of the kernel log up to this).
pub const MAX_TAINT_ERRORS: usize = 32;
pub const MAX_ERROR_NAME_BYTES: usize = 64;

/// Fault thresholds of one config (`spec.health.thresholds`): one per error name, and
/// the documented names are 7; the occurrences one may ask for (each kept as a time in
/// the agent's health state until the window passes it, so the bound sizes that file).
pub const MAX_FAULT_THRESHOLDS: usize = 16;
pub const MAX_THRESHOLD_COUNT: u32 = 100;

/// Bytes of a CloudWatch Logs log group name (CloudWatch Logs' own bound).
pub const MAX_LOG_GROUP_BYTES: usize = 512;

/// Bytes of a CloudWatch namespace (CloudWatch's own bound).
pub const MAX_CLOUDWATCH_NAMESPACE_BYTES: usize = 255;

/// Dimensions of one CloudWatch datum (PutMetricData's bound).
pub const MAX_DATUM_DIMENSIONS: usize = 30;

/// Roll-ups of one CloudWatch sink (each a dimension set of its own, sent every flush).
pub const MAX_ROLLUPS: usize = 10;

/// Bytes of an OTLP endpoint URL (`spec.sinks.otlp.endpoint`, a tenancy policy's entry).
pub const MAX_OTLP_ENDPOINT_BYTES: usize = 512;

/// Bytes of a Secret's name (a DNS subdomain name, as Kubernetes names Secrets).
pub const MAX_SECRET_NAME_BYTES: usize = 253;

// --- Labels a series carries ---------------------------------------------------------

/// Distinct extra Prometheus labels on one series. The agent puts on a runtime's series
/// the extra labels of every route that takes it (the first route wins a name): the
/// operator namespace's configs on every series, a team's configs on its own
/// applications'. The operator refuses a config that would take that union above this
/// (`TooManyLabels`); the agent also enforces it on what it exports, leaving
/// the keys of later routes off and counting them.
pub const MAX_EXTRA_LABELS_PER_SERIES: usize = 32;

// --- The kubelet's pod-resources answer, as the node agent reads it -------------------
// The agent decodes each answer itself (`node-agent/src/attribution/podresources/answer.rs`,
// the one place these bounds apply): what it does not read (other resources, other DRA
// drivers, CDI devices, topology, CPU and memory lists) is skipped as it is decoded, and
// a pod, container, resource or claim is kept only while it holds a kept device, so the
// bounds on devices bound everything kept. What is cut is counted
// (`neuron_agent_kubelet_entries_cut_total{list}`). The answer itself is at most 16 MiB.

/// Device ids of one kind (Neuron: `aws.amazon.com/neuroncore`, `neurondevice`, `neuron`;
/// EFA; NVIDIA GPUs) kept from one answer, and separately the DRA claims' devices of one
/// read driver. A node has at most 64 Neuron devices and 512 cores, 32 EFA devices, 64
/// GPUs (a time-sliced GPU listed once per replica a pod holds); 1,024 was already the cap
/// of the EFA, NVIDIA and claimed-device lists. Without it, 2.5 M ids of one container took
/// the agent from 47 to 227 MB and every poll past its time limit.
pub const MAX_POD_RESOURCES_DEVICES_PER_KIND: usize = 1024;

/// Bytes of one string of an answer (a name, an id). The longest legitimate ones are DNS
/// subdomains (pod and claim names, pools: 253 bytes); a longer string is kept as its
/// first 257 bytes, so that every later check of its length still refuses it.
pub const MAX_POD_RESOURCES_STRING_BYTES: usize = 256;

// --- Log lines about bad input -----------------------------------------------------------

/// Bad items (ids, claimed devices) a log line names, and the bytes each is cut to: the
/// line says how many there were, and these few show what they look like. Before, one
/// answer of 1.2 M bad ids made one 44 MB line.
pub const MAX_LOGGED_ITEMS: usize = 5;
pub const MAX_LOGGED_ITEM_BYTES: usize = 96;

/// Such lines of one kind per [`BAD_INPUT_LOG_PERIOD_SECONDS`]; the next line says how many
/// were left out meanwhile. Before, ids changing at every poll wrote 430 MB of log in 15 s.
pub const MAX_BAD_INPUT_LOG_LINES: u32 = 5;
pub const BAD_INPUT_LOG_PERIOD_SECONDS: u64 = 300;

// --- Neuron hardware health, as the node agent reads it ---------------------------------
// Device indices of the driver's sysfs tree and of kernel-log records are bounded by
// [`MAX_NEURON_DEVICES`], per-device core directories by [`MAX_NEURONCORES_PER_DEVICE`].

/// Bytes read from one sysfs file of the Neuron driver. Every file the agent reads holds
/// one short value (a counter, a state, `unhealthy_components`' list of ten names, the
/// power line of ~50 bytes); a longer file is a broken or hostile tree and is treated
/// as unreadable.
pub const MAX_SYSFS_FILE_BYTES: usize = 4096;

/// Bytes of one kernel-log record (header, text and continuation lines). The kernel's
/// own bound for a `/dev/kmsg` record is 8 KiB (`CONSOLE_EXT_LOG_MAX`); longer lines of a
/// followed regular file are skipped and counted.
pub const MAX_KMSG_RECORD_BYTES: usize = 8192;

/// Kernel-log records handled per wake-up of the follower before the health model is
/// updated (one lock, one state write): a record storm is taken in slices.
pub const MAX_KMSG_RECORDS_PER_BATCH: usize = 1024;

/// Distinct `NEURON_HW_ERR` names, and distinct driver functions of `neuron:` error
/// records, the agent keeps as label values. The six documented names (five fatal ones
/// and the repairable HBM error) and `OTHER` always have their slots; other names fill
/// the rest, beyond which they are counted under `OTHER` (driver functions: `other`).
pub const MAX_HEALTH_ERROR_NAMES: usize = 32;

/// Bytes of the agent's persisted health state (the reasons of at most 64 devices);
/// a larger file is not read.
pub const MAX_HEALTH_STATE_BYTES: usize = 1024 * 1024;

/// Reasons kept per device: 5 ECC counters, 10 components, 5 error counters on each of
/// 16 cores, and the kernel's error names leave it far from full.
pub const MAX_HEALTH_REASONS_PER_DEVICE: usize = 256;

/// Node Events of hardware faults waiting for the API server (an outage, an agent
/// restart during one), per kind of device (Neuron, GPU): every device of the largest
/// instances (16 Neuron devices, 8 GPUs) with four faults each fits; beyond, the latest
/// faults get no Event (counted), and the Node condition still names them all. What a
/// whole fleet writes when the API server returns is bounded by it.
pub const MAX_PENDING_HEALTH_EVENTS: usize = 64;

// --- Tag filters (`tagFilter`), as the operator and the agent compile them ------------
// A filter is compiled once per node for each distinct filter string (see
// `crate::tag_filter`). Its cost is what the compiled filter holds: its program and one
// search cache. Unbounded, Unicode `[\w]{200}r0` took ~13 MB, and 48 such route entries
// took an agent past its 512 MiB memory limit.

/// Bytes of one tag filter's text.
pub const MAX_TAG_FILTER_BYTES: usize = 1024;

/// Bytes of the program (NFA) of one tag filter, and of its one-pass DFA. The compiler
/// stops at this size, so a refused filter costs no more than this to try. The largest
/// literal filter (1,024 characters) takes 25 KiB, `(?i)^[a-z0-9-]{1,63}$` 11 KiB, one
/// `\pL` 16 KiB: six `\pL` in a row fit.
pub const MAX_TAG_FILTER_NFA_BYTES: usize = 128 * 1024;

/// Cost of one tag filter: its program and one search cache, which the search engines
/// grow to about the program's size again. Beyond it: refused as `InvalidSpec`, naming
/// the field. The worst accepted filter thus holds at most 256 KiB, where Unicode
/// `[\w]{200}r0` held ~13 MB; ordinary filters cost 1 to 50 KiB.
pub const MAX_TAG_FILTER_COST: usize = 256 * 1024;

/// Cost of the distinct tag filters of one namespace's configs on one node: 8 filters at
/// the per-filter limit, or hundreds of ordinary ones. Beyond it: `NamespaceLimit`,
/// naming the filter.
pub const MAX_NAMESPACE_TAG_FILTER_COST_PER_NODE: usize = 2 * 1024 * 1024;

/// Cost of the distinct tag filters of all configs on one node, what the agent holds
/// compiled. The operator refuses configs beyond it (`NodeLimit`); the agent, given more
/// (a standalone file, an older operator), leaves the routes beyond it out and counts
/// them.
pub const MAX_NODE_TAG_FILTER_COST: usize = 16 * 1024 * 1024;
