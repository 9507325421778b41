//! Crash-point harness. (Being built: see issue 5.)
