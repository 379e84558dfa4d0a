//! `tessera`: the Tessera daemon and its command-line tools.

use std::io::IsTerminal;

use anyhow::Context;
use clap::{Args, FromArgMatches, Parser, Subcommand};
use tessera_cli::remote::{self, Credentials};
use tessera_cli::{errors, put, resident, warm, writable};
use tessera_server::Daemon;
use tessera_server::config::{LogFormat, ServeArgs, Settings};
use tracing_subscriber::EnvFilter;

/// Tessera serves N-dimensional arrays (.npy) over Arrow Flight, speaking the biopb
/// tensor protocol, with a zero-copy mmap fast path for clients on the same machine.
#[derive(Parser)]
#[command(name = "tessera", version, about)]
struct Cli {
    /// On failure, print every cause on its own line, and the backtrace when
    /// `RUST_BACKTRACE=1` captured one (also with `RUST_LOG=debug`).
    #[arg(short, long, global = true)]
    verbose: bool,
    /// Log line format [default: the config file's `log_format`, else text].
    #[arg(long, global = true, env = "TESSERA_LOG_FORMAT", value_enum)]
    log_format: Option<LogFormat>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve .npy files, Zarr/OME-Zarr stores and directories of them until SIGTERM or Ctrl-C.
    ///
    /// Example (the README's): `tessera serve samples` then, from Python,
    /// `TensorFlightClient("grpc://127.0.0.1:8815").get_tensor("zstack")`. "Basics" below
    /// are the options a first server needs; the other headings are tuning.
    Serve(Box<ServeArgs>),
    /// Read a tensor (or a region of it) into a .npy file numpy reads back exactly.
    ///
    /// On a loopback server chunks are mapped from the server's segment files
    /// (zero copies through the socket); elsewhere they stream over do_get.
    Get(GetArgs),
    /// List the tensors a server serves.
    Ls(RemoteArgs),
    /// Print a server's chunk cache counters.
    Stats(RemoteArgs),
    /// Fill a server's chunk cache with whole arrays, ahead of readers.
    ///
    /// Every chunk goes through `chunk_locate` (decoded and written to the file cache if
    /// cold); a progress line is drawn on a terminal and a summary printed at the end.
    Warm(WarmArgs),
    /// Upload a .npy file to a --writable server and publish it (READY).
    ///
    /// ARRAY_ID is `[cache://]<source>/@fields/<name>`, e.g. `scratch/@fields/result`;
    /// the file is sent chunk by chunk on the server's grid with a progress line.
    Put(PutArgs),
    /// Work with config files.
    #[command(subcommand)]
    Config(ConfigCommand),
}

/// Arguments of `tessera warm`.
#[derive(clap::Args)]
struct WarmArgs {
    #[command(flatten)]
    remote: RemoteArgs,
    /// Array ids to warm, whole.
    #[arg(required = true)]
    array_ids: Vec<String>,
    /// Chunks warmed at once.
    #[arg(long, default_value_t = warm::DEFAULT_CONCURRENCY)]
    concurrency: usize,
    /// Warm the computed pyramid levels the server advertises instead of full resolution.
    #[arg(long)]
    levels: bool,
}

/// Arguments of `tessera put`.
#[derive(clap::Args)]
struct PutArgs {
    #[command(flatten)]
    remote: RemoteArgs,
    /// The upload's id: `[cache://]<source>/@fields/<name>`.
    array_id: String,
    /// The .npy file to upload.
    file: std::path::PathBuf,
    /// Lifetime in seconds (the server may cap it).
    #[arg(long, value_name = "SECONDS")]
    ttl: Option<u32>,
}

/// `tessera config ...`.
#[derive(Subcommand)]
enum ConfigCommand {
    /// Validate FILE and print the effective configuration (FILE with `TESSERA_*`
    /// environment variables applied over it, defaults filled in, token redacted).
    Check {
        /// The TOML config file.
        file: std::path::PathBuf,
    },
}

/// Where a server is and how to authenticate to it.
#[derive(clap::Args)]
struct RemoteArgs {
    /// Server location, e.g. grpc://127.0.0.1:8815.
    location: String,
    /// Bearer token, if the server requires one.
    #[arg(long, env = "TESSERA_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// PEM CA certificate to check a grpcs:// (grpc+tls://) server against; for a
    /// self-signed server, its own certificate.
    #[arg(long, value_name = "FILE", env = "TESSERA_TLS_CA")]
    tls_ca: Option<std::path::PathBuf>,
}

impl RemoteArgs {
    fn credentials(&self) -> Credentials<'_> {
        Credentials {
            token: self.token.as_deref(),
            tls_ca: self.tls_ca.as_deref(),
        }
    }
}

/// Arguments of `tessera get`.
#[derive(clap::Args)]
struct GetArgs {
    #[command(flatten)]
    remote: RemoteArgs,
    /// The array id to read.
    array_id: String,
    /// Region to read, numpy-like per axis: `0:10,:,100:`; negative numbers count from
    /// the end (`--region -10:,:`), an integer index drops its axis (`5,:` of a 2-D array
    /// is 1-D), a slice whose stop is before its start is an empty axis.
    #[arg(long, allow_hyphen_values = true, value_name = "REGION")]
    region: Option<String>,
    /// Output .npy path; `-` writes the .npy to standard output (the summary then goes to
    /// stderr).
    #[arg(short, long, allow_hyphen_values = true)]
    output: std::path::PathBuf,
    /// Never map segment files; fetch every chunk over the socket.
    #[arg(long)]
    no_mmap: bool,
    /// Read downsampled: one integer factor per axis, e.g. `1,4,4` (the region stays in
    /// full-resolution coordinates).
    #[arg(long, value_delimiter = ',', value_name = "FACTORS")]
    scale: Option<Vec<u64>>,
    /// Reduction of a scaled read: nearest (strided pick, the default) or area (block mean).
    #[arg(long, requires = "scale", value_name = "METHOD")]
    method: Option<String>,
}

/// Maps the binary's code and constants in the background (`resident_code`): the server
/// answers meanwhile, and a failure is logged, never fatal.
fn keep_code_resident() {
    let spawned = std::thread::Builder::new()
        .name("resident-code".to_string())
        .spawn(|| match resident::keep_code_resident() {
            Ok(done) => tracing::debug!(
                mib = done.bytes >> 20,
                ms = done.took.as_millis() as u64,
                "the binary's code and constants are resident"
            ),
            Err(err) => tracing::warn!(
                error = %errors::one_line(&anyhow::Error::new(err)),
                "cannot keep the binary's code resident; rarely used calls may read it from disk"
            ),
        });
    if let Err(err) = spawned {
        tracing::warn!(error = %err, "cannot start the thread that keeps the binary's code resident");
    }
}

fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colour codes only where a person reads them: not in a file, a pipe or under NO_COLOR.
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// The future that resolves on Ctrl-C or SIGTERM. The handlers are installed here, when
/// it is called, not when the future is first polled: the server logs "listening" before
/// its accept loop polls the shutdown future, and a SIGTERM in between would otherwise
/// kill the process without a clean stop.
fn stop_signal() -> impl std::future::Future<Output = ()> {
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate());
    let ctrl_c = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt());
    async move {
        let wait = |signal: std::io::Result<tokio::signal::unix::Signal>, name: &'static str| async move {
            match signal {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(err) => {
                    tracing::error!(error = %err, "cannot listen for {name}");
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::select! {
            () = wait(ctrl_c, "Ctrl-C") => {},
            () = wait(term, "SIGTERM") => {},
        }
    }
}

/// Runs the command; a failure is one line on stderr (`error: …`, with what to do next when
/// there is an obvious next step) and exit code 1. `-v` or `RUST_LOG=debug` print the causes
/// and the backtrace.
fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let verbose = cli.verbose
        || std::env::var("RUST_LOG").is_ok_and(|v| v.contains("debug") || v.contains("trace"));
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            if verbose {
                eprintln!("error: {err:?}");
            } else {
                eprintln!("error: {}", errors::one_line(&err));
            }
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    if !matches!(cli.command, Command::Serve(_)) {
        init_logging(cli.log_format.unwrap_or_default());
    }
    match cli.command {
        Command::Serve(args) => {
            let settings = Settings::resolve(*args).context("invalid configuration")?;
            init_logging(cli.log_format.unwrap_or(settings.operations.log_format));
            if settings.served_paths.is_empty() {
                tracing::warn!(
                    "no sources given: pass .npy files, Zarr stores or directories to serve"
                );
            }
            let stop = stop_signal();
            let missing: Vec<String> = settings
                .served_paths
                .iter()
                .filter(|p| !p.exists())
                .map(|p| p.display().to_string())
                .collect();
            if !missing.is_empty() && !settings.watch_requested {
                anyhow::bail!(
                    "source path {} does not exist; check the path, or pass --watch to serve it \
                     once it appears",
                    missing.join(", ")
                );
            }
            let daemon = Daemon::bind(&settings)
                .await
                .context("cannot start the server")?;
            if settings.operations.resident_code {
                keep_code_resident();
            }
            daemon.run(stop).await.context("server failed")?;
        }
        Command::Get(args) => {
            let summary = remote::get(
                &args.remote.location,
                &args.array_id,
                args.region.as_deref(),
                args.scale.map(|factors| tessera_client::ReadScale {
                    factors,
                    method: args.method.unwrap_or_default(),
                }),
                output_path(&args.output),
                args.no_mmap,
                args.remote.credentials(),
            )
            .await?;
            if args.output.as_os_str() == "-" {
                // Standard output holds the array; the summary goes beside it, on stderr.
                eprintln!("{summary}");
            } else {
                println!("{summary}");
            }
        }
        Command::Put(args) => {
            let summary = put::put(
                &args.remote.location,
                &args.array_id,
                &args.file,
                args.ttl,
                args.remote.credentials(),
            )
            .await?;
            println!("{summary}");
        }
        Command::Ls(args) => {
            let text = remote::ls(&args.location, args.credentials()).await?;
            print!("{text}");
        }
        Command::Stats(args) => {
            let text = remote::stats(&args.location, args.credentials()).await?;
            print!("{text}");
        }
        Command::Warm(args) => {
            let summary = warm::warm(
                &args.remote.location,
                args.remote.credentials(),
                &args.array_ids,
                args.concurrency,
                args.levels,
            )
            .await
            .context("cannot warm the cache")?;
            println!("{summary}");
        }
        Command::Config(ConfigCommand::Check { file }) => {
            // Flags of `serve` are absent here, so its environment variables apply as they would.
            let matches = ServeArgs::augment_args(clap::Command::new("serve"))
                .try_get_matches_from(["serve"])?;
            let mut args = ServeArgs::from_arg_matches(&matches)?;
            args.config = Some(file.clone());
            let mut settings = Settings::resolve(args)
                .with_context(|| format!("{} is not a valid configuration", file.display()))?;
            if let Some(format) = cli.log_format {
                settings.operations.log_format = format;
            }
            for path in settings.served_paths.iter().filter(|p| !p.exists()) {
                eprintln!("warning: source {} does not exist (yet)", path.display());
            }
            let mut unwritable = false;
            for (key, dir, needed) in [
                (
                    "state_dir",
                    &settings.writes.state_dir,
                    settings.writes.writable,
                ),
                ("[cache] dir", &settings.cache.dir, false),
            ] {
                if let Err(why) = writable::check(dir) {
                    let consequence = if needed {
                        unwritable = true;
                        "a --writable server would not start"
                    } else if key == "state_dir" {
                        "the server would keep no annotations"
                    } else {
                        "the server would cache in RAM only"
                    };
                    eprintln!(
                        "{}: {key} {} is not writable by this user ({why}): {consequence}",
                        if needed { "error" } else { "warning" },
                        dir.display()
                    );
                }
            }
            print!(
                "# effective configuration of {}\n{}",
                file.display(),
                tessera_server::config::effective::render(&settings)
            );
            if unwritable {
                anyhow::bail!(
                    "{} names a directory this user cannot write",
                    file.display()
                );
            }
        }
    }
    Ok(())
}

/// Where `tessera get -o OUT` writes: `-` is standard output.
fn output_path(out: &std::path::Path) -> &std::path::Path {
    if out.as_os_str() == "-" {
        std::path::Path::new("/dev/stdout")
    } else {
        out
    }
}
