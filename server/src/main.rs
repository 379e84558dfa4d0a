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
    /// Read a tensor (or a region of it) into a .npy file numpy reads back exactly.
    ///
    /// On a loopback server chunks are mapped from the server's segment files (nothing
    /// crosses the socket but the plan); elsewhere they stream over do_get.
    /// Example: `tessera get grpc://127.0.0.1:8815 zstack --region 0:4,:,100: -o z.npy`.
    Get(GetArgs),
    /// List the tensors a server serves (id, shape, dtype, chunk shape, axis labels).
    Ls(RemoteArgs),
    /// Print a server's chunk cache counters (hits, misses, bytes, evictions, segments).
    Stats(RemoteArgs),
}

/// Where a server is and how to authenticate to it.
#[derive(clap::Args)]
struct RemoteArgs {
    /// Server location, e.g. grpc://127.0.0.1:8815.
    location: String,
    /// Bearer token, when the server requires one.
    #[arg(long, env = "TESSERA_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

/// Arguments of `tessera get`.
#[derive(clap::Args)]
struct GetArgs {
    #[command(flatten)]
    remote: RemoteArgs,
    /// The array id to read (see `tessera ls`).
    array_id: String,
    /// Region to read, numpy-like per axis, e.g. `0:10,:,100:` (default: the whole tensor).
    #[arg(long)]
    region: Option<String>,
    /// Output .npy path.
    #[arg(short, long)]
    output: std::path::PathBuf,
    /// Never map segment files; fetch every chunk over the socket (do_get).
    #[arg(long)]
    no_mmap: bool,
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
        Command::Get(args) => {
            let summary = tessera_client::cli_get(
                &args.remote.location,
                &args.array_id,
                args.region.as_deref(),
                &args.output,
                args.no_mmap,
                args.remote.token.as_deref(),
            )
            .await
            .with_context(|| format!("cannot read '{}'", args.array_id))?;
            println!("{summary}");
        }
        Command::Ls(remote) => {
            let text = tessera_client::cli_ls(&remote.location, remote.token.as_deref())
                .await
                .context("cannot list tensors")?;
            print!("{text}");
        }
        Command::Stats(remote) => {
            let text = tessera_client::cli_stats(&remote.location, remote.token.as_deref())
                .await
                .context("cannot read cache stats")?;
            print!("{text}");
        }
    }
    Ok(())
}
