//! The coordinator group (placeholder on this branch: the lead merges the full module).

pub mod rules;
