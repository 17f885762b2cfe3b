//! CloudWatch Logs' rules, checked for a config's `spec.health.logs` and for the agent's
//! flags and hand-written node configurations alike.

use crate::limits::MAX_LOG_GROUP_BYTES;

/// A log group CloudWatch Logs accepts and AWS does not reserve.
pub fn check_log_group(group: &str) -> Result<(), String> {
    let chars_ok = group.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '/' | '.' | '#' | '-'));
    if group.is_empty() || group.len() > MAX_LOG_GROUP_BYTES || !chars_ok {
        return Err(format!("is 1 to {MAX_LOG_GROUP_BYTES} letters, digits, '_', '/', '.', '#' or '-'"));
    }
    if group.starts_with("aws/") {
        return Err("log groups starting with aws/ are reserved for AWS services".to_owned());
    }
    Ok(())
}
