//! grid (in progress)
