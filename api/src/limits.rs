//! Limits shared by the operator and the node agent, each with the reason for its value.
//! Every limit is documented in the README and counted where it refuses something.

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

/// Configs (routes) on one node: the agent walks every route for every runtime of every
/// report. Beyond it: `NodeLimit`.
pub const MAX_CONFIGS_PER_NODE: usize = 512;

/// Distinct extra Prometheus labels on one series. The agent puts on a runtime's series
/// the extra labels of every route that takes it (the first route wins a name): the
/// operator namespace's configs on every series, a team's configs on its own
/// applications'. The operator refuses a config that would take that union above this
/// (`TooManyLabels`); the agent also enforces it on what it exports.
pub const MAX_EXTRA_LABELS_PER_SERIES: usize = 32;
