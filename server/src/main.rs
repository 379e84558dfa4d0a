//! `tessera`: the Tessera daemon and its command-line tools.

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use tessera_server::config::{ServeArgs, ServeConfig};
use tessera_server::daemon::Daemon;
use tracing_subscriber::EnvFilter;

/// Tessera serves N-dimensional arrays (.npy) over Arrow Flight, speaking the biopb
/// tensor protocol, with a zero-copy mmap fast path for clients on the same machine.
#[derive(Parser)]
#[command(name = "tessera", version, about)]
struct Cli {
    /// Log line format.
    #[arg(
        long,
        global = true,
        env = "TESSERA_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Serve .npy files and directories until SIGTERM or Ctrl-C.
    ///
    /// Example: `tessera serve samples/` then, from Python,
    /// `biopb.tensor.TensorFlightClient("grpc://127.0.0.1:8815").get_array("zstack")`.
    Serve(ServeArgs),
}

fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

async fn stop_signal() {
    let ctrl_c = async {
        if let Err(err) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %err, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(err) => {
                tracing::error!(error = %err, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    match cli.command {
        Command::Serve(args) => {
            let config = ServeConfig::resolve(args).context("invalid configuration")?;
            if config.paths.is_empty() {
                tracing::warn!("no sources given: pass .npy files or directories to serve");
            }
            let daemon = Daemon::bind(&config)
                .await
                .context("cannot start the server")?;
            daemon.run(stop_signal()).await.context("server failed")?;
        }
    }
    Ok(())
}
