//! The `tessera` command run as a user runs it, one module per behaviour, in one test binary
//! rather than one per file (docs/decisions/0021). Run one with
//! `cargo test -p tessera-cli --test integration MODULE::`.

mod config_check;
mod errors_are_one_line_and_say_what_to_do;
mod get_writes_npy_numpy_reads;
mod second_server_is_told_to_use_its_own_cache_dir;
mod serve_watches_folders_and_says_how_to_read;
