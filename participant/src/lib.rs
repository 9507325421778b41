//! (Being built.)
pub mod cli;
