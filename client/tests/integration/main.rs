//! The integration tests of `tessera-client` against the real `tessera` binary, one module
//! per behaviour, in one test binary rather than one per file (docs/decisions/0021). Run one
//! with `cargo test -p tessera-client --test integration MODULE::`.

mod common;

mod fallback_on_memory_cache;
mod fallback_on_unknown_action;
mod mmap_path_is_really_used;
mod pin_limit_turns_views_into_copies;
mod token_is_sent_on_every_call;
mod views_survive_eviction;
mod whole_and_region_reads_bit_exact;
