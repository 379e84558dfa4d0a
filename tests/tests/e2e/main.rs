//! The end-to-end scenarios, one module per scenario, named by the behaviour it proves.
//!
//! They are one test binary rather than one per file: each binary links the whole server
//! (DataFusion included, about 200 MB in a debug build), and 32 of them filled 7.5 GB of
//! `target/` (docs/decisions/0021). The scenarios run on the harness's threads side by side:
//! none changes the process's environment, working directory or limits, each gets its own
//! temporary directories and loopback ports, and servers whose memory is measured run as
//! child processes. Run one scenario with
//! `cargo test -p tessera-e2e --test e2e SCENARIO::`.
//!
//! **Both grids** (docs/decisions/0015). Every scenario that reads a tensor's bytes through
//! a plan runs twice, as `…::fine` and `…::coarse` (`on_both_grids!` in `tests/src/lib.rs`):
//! on the fine grid socket readers get, and on the coarse grid loopback clients that map get,
//! with the fine grid configured beside it as in a daemon; each checks that its plans were
//! cut on its grid (`assert_planned_on`). Scenarios that count chunks ask for the same cell
//! size on both (`Grid::chunk_target_for`). One grid only, by design: the 2 GiB memory
//! bounds, stalled and unread DoGet streams and idle connections (the socket route, which
//! remote clients take and which never plans coarse for them), the memory cache (never
//! mappable, so never coarse), and scenarios that refuse input or browse without reading
//! bytes. `both_plans_serve_the_same_bytes` reads one tensor through both plans of one
//! learning server.

mod annotations_stay_within_memory_bounds;
mod both_plans_serve_the_same_bytes;
mod cache_files_are_private_unless_shared;
mod catalog_bounds;
mod catalog_sql;
mod catalog_sql_text_is_answered_or_refused;
mod cells_are_cut_from_the_other_grids_cache;
mod changing_sources_never_serve_stale_bytes;
mod chunk_locate_points_at_the_message;
mod cold_2gib_read_keeps_server_memory_bounded;
mod cold_plans_decode_their_ends;
mod cold_scaled_2gib_read_keeps_server_memory_bounded;
mod concurrent_adds_serve_each_file_once;
mod concurrent_cold_reads_decode_once;
mod crash_loses_nothing_a_client_located;
mod descriptor_limit_keeps_every_source;
mod disk_full_keeps_serving;
mod eviction_soak_keeps_mmap_clients_safe;
mod forged_tickets_are_refused;
mod hostile_catalog_queries_are_refused_in_time;
mod hostile_requests_are_refused_and_bounded;
mod idle_connections_are_capped_and_closed;
mod ids_stay_with_their_files;
mod in_place_writes_are_never_served_torn;
mod list_flights_browses_tensors;
mod malformed_source_is_refused_others_serve;
mod metrics_endpoint_counts_reads;
mod over_long_array_ids_are_refused_by_length;
mod plan_tiles_whole_tensor;
mod rewritten_source_gets_new_ids;
mod scaled_reads_are_bounded_and_stop_with_their_caller;
mod sequential_reads_decode_ahead;
mod slice_is_snapped_and_crops_right;
mod sources_never_leave_their_roots;
mod stalled_streams_are_closed_and_unpinned;
mod token_is_enforced;
mod unknown_ids_and_actions_are_classified;
mod unread_catalog_and_roi_replies_are_closed_and_unpinned;
mod unread_do_get_streams_hold_no_server_memory;
mod warm_fills_the_cache;
mod watched_directory_tracks_files;
