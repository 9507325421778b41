//! The write-ahead log. (Being built: see issue 2.)
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
