//! The invariant audit, kept under its old name for `twopc demo` and `twopc audit`: the checks
//! themselves live in [`crate::oracle`], one file per invariant.

pub use crate::oracle::{
    AuditReport, Check, ClientOutcome, ClusterUrls, ReadError, RunRecord, Totals, audit,
    read_totals, wait_no_prepared,
};
