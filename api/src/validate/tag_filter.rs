//! `spec.runtimes[].tagFilter`: a regular expression that must mean the same to this
//! operator and to neuron-monitor (Go's RE2 syntax), alone and in the merged filter, and
//! cost little to compile ([`crate::tag_filter`] says both).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use crate::tag_filter::TagFilter;

/// Verdicts of [`TagFilter::new`] (the filter's cost, or why it is refused), by filter.
/// Compiling is most of validation and the controller validates every config on every
/// pass, with the same few filters across namespaces. Bounded: cleared when full.
static COMPILED: Mutex<Option<HashMap<String, Result<usize, String>>>> = Mutex::new(None);
const COMPILED_CAPACITY: usize = 8192;

/// A tag filter must compile within the cost limits, stay within what neuron-monitor's Go
/// regexp accepts, and still mean the same when wrapped in a group for the merged
/// `(a)|(b)` filter. Returns its cost.
pub(super) fn check_tag_filter(filter: &str) -> Result<usize, String> {
    let cached = |cache: &Option<HashMap<String, Result<usize, String>>>| cache.as_ref()?.get(filter).cloned();
    if let Some(verdict) = cached(&COMPILED.lock().unwrap_or_else(PoisonError::into_inner)) {
        return verdict;
    }
    // Compiled outside the lock: validations on other threads need not wait.
    let verdict = TagFilter::new(filter).map(|f| f.cost()).map_err(|e| e.to_string());
    let mut cache = COMPILED.lock().unwrap_or_else(PoisonError::into_inner);
    let cache = cache.get_or_insert_with(HashMap::new);
    if cache.len() >= COMPILED_CAPACITY {
        cache.clear();
    }
    cache.insert(filter.to_owned(), verdict.clone());
    verdict
}
