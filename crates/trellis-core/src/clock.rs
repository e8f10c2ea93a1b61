//! The wall clock, as the operator and the CLI write it: RFC 3339 with
//! second precision. A leaf both use, so neither takes it from the other.

/// Current time as RFC 3339 with second precision (`2026-11-29T08:00:00Z`).
pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}
