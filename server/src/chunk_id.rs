//! chunk ids (in progress)
