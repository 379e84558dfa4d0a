//! Running Tessera as a long-lived process: the [`daemon`] and its [`config`]uration, the
//! [`watch`]er that rescans served folders and the [`scrape`] endpoint that serves metrics.

pub mod config;
pub mod daemon;
pub mod scrape;
pub mod watch;
