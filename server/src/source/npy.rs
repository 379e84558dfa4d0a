//! npy reader (in progress)
