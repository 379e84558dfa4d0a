//! The real `tessera` binary as a child process: for tests that kill it, restart it on the
//! same cache directory, or measure its memory from /proc.
//!
//! The binary is `$TESSERA_BIN` when set, else `target/debug/tessera` of this workspace, which
//! is (re)built once per test process with `cargo build -p tessera-cli --bin tessera` so a
//! stale binary is never tested.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use arrow_flight::FlightClient;

/// The workspace root (this crate lives in `tests/support/`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// Path of the server binary, building it first unless `$TESSERA_BIN` names one.
pub fn tessera_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(bin) = std::env::var_os("TESSERA_BIN").filter(|b| !b.is_empty()) {
            return PathBuf::from(bin);
        }
        let root = workspace_root();
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut build = Command::new(cargo);
        build
            .args(["build", "--quiet", "-p", "tessera-cli", "--bin", "tessera"])
            .current_dir(&root);
        // The variables cargo sets for this test process describe this crate, not the build:
        // ring's build script tracks CARGO_MANIFEST_DIR, so inheriting it made this build and
        // the next `cargo test`/`cargo build` redo ring, rustls, tonic and everything above
        // them in turn (a minute and a half of compiling inside whichever test came first).
        for (key, _) in std::env::vars_os() {
            let key = key.to_string_lossy();
            if key == "CARGO_MANIFEST_DIR"
                || key == "CARGO_MANIFEST_PATH"
                || key == "CARGO_CRATE_NAME"
                || key == "CARGO_PRIMARY_PACKAGE"
                || key == "CARGO_TARGET_TMPDIR"
                || key == "CARGO_RUSTC_CURRENT_DIR"
                || key.starts_with("CARGO_PKG_")
                || key.starts_with("CARGO_BIN_")
            {
                build.env_remove(key.as_ref());
            }
        }
        let status = build.status().expect("cargo runs");
        assert!(status.success(), "building the tessera binary failed");
        root.join("target").join("debug").join("tessera")
    })
    .clone()
}

/// The interop venv's Python (`$TESSERA_PYTHON`, else `.venv/bin/python`) if it has biopb,
/// numpy and pyarrow; tests that need it skip with a message otherwise.
pub fn have_python_venv() -> Option<PathBuf> {
    let python = std::env::var_os("TESSERA_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".venv").join("bin").join("python"));
    let ok = Command::new(&python)
        .args(["-c", "import biopb.tensor, numpy, pyarrow"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    ok.then_some(python)
}

/// A running `tessera serve` child process. Dropping it kills the process.
pub struct ServerProcess {
    child: Child,
    /// The bound address, parsed from the `listening on grpc://ADDR` log line.
    pub addr: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
    /// The state directory of this process alone (`TESSERA_STATE_DIR`), unless the scenario
    /// names one: no test writes into the user's `~/.local/share/tessera`.
    _state: tempfile::TempDir,
}

impl ServerProcess {
    /// Starts `tessera serve ARGS --listen 127.0.0.1:0` with `RUST_LOG=info`, `NO_COLOR=1`,
    /// `TESSERA_WATCH=false` and a fresh `TESSERA_STATE_DIR`, and waits (up to 60 s) for it to listen. Panics with the log
    /// if it does not.
    pub fn spawn<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> ServerProcess {
        Self::spawn_env(args, &[])
    }

    /// `tessera serve SOURCES --cache-dir CACHE [--cache-max-bytes MAX] --chunk-target TARGET`:
    /// the shape of most scenarios that size their cache and chunks.
    pub fn serve_cached(
        sources: &Path,
        cache: &Path,
        max_bytes: Option<&str>,
        chunk_target: &str,
    ) -> ServerProcess {
        let mut args: Vec<&OsStr> = vec![
            sources.as_os_str(),
            OsStr::new("--cache-dir"),
            cache.as_os_str(),
        ];
        if let Some(max) = max_bytes {
            args.extend([OsStr::new("--cache-max-bytes"), OsStr::new(max)]);
        }
        args.extend([OsStr::new("--chunk-target"), OsStr::new(chunk_target)]);
        Self::spawn(&args)
    }

    /// Like [`ServerProcess::spawn`], with extra environment variables; an empty value
    /// removes the variable (e.g. `("TESSERA_WATCH", "")` for the default of `serve`).
    pub fn spawn_env<S: AsRef<std::ffi::OsStr>>(args: &[S], env: &[(&str, &str)]) -> ServerProcess {
        let state = tempfile::Builder::new()
            .prefix("tessera-state")
            .tempdir()
            .expect("a temporary state directory");
        let mut command = Command::new(tessera_bin());
        command
            .env("TESSERA_STATE_DIR", state.path())
            .arg("serve")
            .args(args)
            .args(["--listen", "127.0.0.1:0"])
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .env_remove("TESSERA_TOKEN")
            .env_remove("TESSERA_CONFIG")
            // The fine grid alone unless a flag or `env` asks for the coarse grid of mapped
            // loopback reads (docs/decisions/0015; `Grid::serve_flags` in tessera-e2e).
            .env("TESSERA_MAPPED_CHUNK_TARGET", "0")
            // Scenarios change their sources under a server that does not rescan them
            // unless they ask (`--watch`); the default is watched.
            .env("TESSERA_WATCH", "false")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            if v.is_empty() {
                command.env_remove(k);
            } else {
                command.env(k, v);
            }
        }
        let mut child = command.spawn().expect("tessera starts");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel::<SocketAddr>();
        let sink = log.clone();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if !sent && let Some(addr) = listening_addr(&line) {
                    sent = tx.send(addr).is_ok();
                }
                sink.lock().unwrap().push(line);
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(addr) => addr,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "tessera did not start listening:\n{}",
                    log.lock().unwrap().join("\n")
                );
            }
        };
        ServerProcess {
            child,
            addr,
            log,
            _state: state,
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `http://ADDR` for tonic.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A Flight client with the decode limit raised above the 64 MiB chunk cap.
    pub async fn client(&self) -> FlightClient {
        crate::connect::flight_client(self.url()).await
    }

    /// Every stderr line so far.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// Whether a stderr line containing `needle` arrives within `timeout` (the server logs
    /// from its own threads and the lines reach the test through a pipe: a line logged just
    /// before a reply may be read just after it).
    pub fn log_arrives(&self, needle: &str, timeout: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        while self.log_count(needle) == 0 {
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        true
    }

    /// How many stderr lines contain `needle`.
    pub fn log_count(&self, needle: &str) -> usize {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }

    /// SIGKILL, then reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then wait up to 30 s (SIGKILL after that).
    pub fn terminate(&mut self) -> ExitStatus {
        // SAFETY: `kill(2)` on our own child's pid; no memory is involved.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                self.kill();
                return self.child.wait().unwrap();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// The process's anonymous resident memory (heap, stacks, private copies) in bytes, from
    /// `/proc/PID/smaps_rollup`. File pages of mapped segments and sources are excluded: they
    /// are page cache the kernel can drop, not memory the server holds.
    pub fn anonymous_rss(&self) -> u64 {
        anonymous_rss(self.pid())
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A `kB` field of `/proc/PID/status` (`"VmHWM:"`, the peak resident memory; `"VmRSS:"`),
/// in bytes.
pub fn status_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .map(|v| {
            v.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .unwrap()
                * 1024
        })
        .unwrap_or_else(|| panic!("/proc/{pid}/status has no {field} line"))
}

/// User plus system CPU of `pid`, in clock ticks (`utime` and `stime` of `/proc/PID/stat`).
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// `Anonymous:` of `/proc/PID/smaps_rollup`, in bytes.
pub fn anonymous_rss(pid: u32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("Anonymous:"))
        .map(|v| {
            v.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .unwrap()
                * 1024
        })
        .expect("smaps_rollup has an Anonymous line")
}

fn listening_addr(line: &str) -> Option<SocketAddr> {
    let rest = line.split("listening on ").nth(1)?;
    let rest = rest.split("://").nth(1)?;
    let addr: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
        .collect();
    addr.parse().ok()
}

/// What one run of a `tessera` command printed, and how it exited.
pub struct CliRun {
    /// Exit code (`None`: killed by a signal).
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

/// Runs `tessera ARGS` to completion with `env` over a cleaned environment (no
/// `TESSERA_*` or `RUST_*` variables of the caller, `NO_COLOR=1`).
pub fn run_cli<S: AsRef<OsStr>>(args: &[S], env: &[(&str, &str)]) -> CliRun {
    let mut command = Command::new(tessera_bin());
    command.args(args).env("NO_COLOR", "1").stdin(Stdio::null());
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        if key.starts_with("TESSERA_") || key.starts_with("RUST_") {
            command.env_remove(key);
        }
    }
    command.envs(env.iter().copied());
    let output = command.output().expect("tessera runs");
    CliRun {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}
