//! The kernel calls libc offers no safe wrapper for: file leases (asked by
//! `source::npy::writers`) and a TCP socket's `TCP_INFO` (sampled by the accept loop's
//! connections for `--wire-compression auto`, docs/decisions/0039); and the one zarrs
//! constructor that is `unsafe` (a decode target over a caller's buffer, which lets a Zarr
//! region decode straight into the chunk buffer instead of a fresh one copied after).
//!
//! This module holds the server crate's only `unsafe` code.

use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::Once;

use unsafe_cell_slice::UnsafeCellSlice;
use zarrs::array::{ArrayBytesFixedDisjointView, ArraySubset};

/// Places a read lease on `file` (`fcntl(F_SETLEASE, F_RDLCK)`): `Ok` when placed, else
/// the kernel's refusal (`EAGAIN`/`EBUSY`: someone has it open for writing).
pub fn set_read_lease(file: &impl AsFd) -> io::Result<()> {
    ignore_lease_breaks();
    let fd = file.as_fd().as_raw_fd();
    // SAFETY: `fd` is a valid descriptor borrowed from `file` for the call; F_SETLEASE
    // takes an integer argument and touches no memory of ours.
    if unsafe { libc::fcntl(fd, libc::F_SETLEASE, libc::F_RDLCK) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Releases a lease [`set_read_lease`] placed on `file`.
pub fn release_lease(file: &impl AsFd) {
    let fd = file.as_fd().as_raw_fd();
    // SAFETY: as in `set_read_lease`; releasing the lease placed on this descriptor.
    unsafe { libc::fcntl(fd, libc::F_SETLEASE, libc::F_UNLCK) };
}

/// A writer opening the file between placing and releasing a lease makes the kernel send
/// the lease holder `SIGIO`, whose default action ends the process; ignore it once.
fn ignore_lease_breaks() {
    static IGNORE: Once = Once::new();
    IGNORE.call_once(|| {
        // SAFETY: installing SIG_IGN for SIGIO runs no handler code; nothing in the
        // process relies on SIGIO (no O_ASYNC descriptors are used).
        unsafe { libc::signal(libc::SIGIO, libc::SIG_IGN) };
    });
}

/// The leading fields of the kernel's `struct tcp_info` (include/uapi/linux/tcp.h) up to
/// `tcpi_delivery_rate` (Linux 4.9); the kernel copies as much as the caller asks for.
#[repr(C)]
#[derive(Default)]
struct TcpInfoHead {
    /// `tcpi_state` … `tcpi_options`, the window scales, then the byte whose lowest bit is
    /// `tcpi_delivery_rate_app_limited`.
    bytes: [u8; 8],
    /// `tcpi_rto` … `tcpi_total_retrans`.
    words: [u32; 24],
    pacing_rate: u64,
    max_pacing_rate: u64,
    bytes_acked: u64,
    bytes_received: u64,
    /// `tcpi_segs_out` … `tcpi_data_segs_out`.
    counts: [u32; 6],
    delivery_rate: u64,
}

/// What `TCP_INFO` says about a socket's sending.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpDelivery {
    /// Bytes the peer acknowledged so far.
    pub bytes_acked: u64,
    /// The kernel's latest delivery rate sample, bytes per second.
    pub delivery_rate: u64,
    /// Whether that sample was limited by the sender having too little to send (then it
    /// says little about the link).
    pub app_limited: bool,
}

/// `TCP_INFO` of a TCP socket; `None` if the kernel refuses or is older than Linux 4.9
/// (no delivery rate).
pub fn tcp_delivery(socket: &impl AsFd) -> Option<TcpDelivery> {
    let fd = socket.as_fd().as_raw_fd();
    let mut info = TcpInfoHead::default();
    let mut len = std::mem::size_of::<TcpInfoHead>() as libc::socklen_t;
    // SAFETY: `fd` is a valid descriptor borrowed for the call; `info` is a plain
    // `repr(C)` struct of integers, valid for any bytes, and `len` is its size: the kernel
    // writes at most `len` bytes into it and stores how many it wrote in `len`.
    let done = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&raw mut info).cast::<libc::c_void>(),
            &raw mut len,
        )
    };
    if done != 0 || (len as usize) < std::mem::size_of::<TcpInfoHead>() {
        return None;
    }
    Some(TcpDelivery {
        bytes_acked: info.bytes_acked,
        delivery_rate: info.delivery_rate,
        app_limited: info.bytes[7] & 1 == 1,
    })
}

/// A zarrs decode target covering all of `out`, a C-order buffer of an array of `shape`
/// with elements of `itemsize` bytes: `Array::retrieve_array_subset_into_opt` then writes
/// each decoded chunk into its place in `out`. `None` (not a panic) when `out` is not
/// exactly `shape`'s bytes.
pub fn decode_target<'a>(
    out: &'a mut [u8],
    itemsize: usize,
    shape: &'a [u64],
) -> Option<ArrayBytesFixedDisjointView<'a>> {
    let bytes = shape
        .iter()
        .try_fold(itemsize as u64, |acc, n| acc.checked_mul(*n))
        .and_then(|n| usize::try_from(n).ok());
    if bytes != Some(out.len()) {
        return None;
    }
    let whole = ArraySubset::new_with_shape(shape.to_vec());
    // SAFETY: the view covers the whole of `out`, which it borrows mutably for its whole
    // life, so no other view of the same bytes can exist while it does (the constructor's
    // one requirement: views of one buffer must not overlap). Its own panic (a byte count
    // above usize::MAX) cannot happen: the product was checked against `out.len()` above.
    unsafe { ArrayBytesFixedDisjointView::new(UnsafeCellSlice::new(out), itemsize, shape, whole) }
        .ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    use super::*;

    #[test]
    fn the_head_matches_the_kernel_layout() {
        assert_eq!(std::mem::offset_of!(TcpInfoHead, bytes_acked), 120);
        assert_eq!(std::mem::offset_of!(TcpInfoHead, delivery_rate), 160);
        #[cfg(target_env = "gnu")]
        {
            assert_eq!(
                std::mem::offset_of!(TcpInfoHead, bytes_acked),
                std::mem::offset_of!(libc::tcp_info, tcpi_bytes_acked)
            );
            assert_eq!(
                std::mem::offset_of!(TcpInfoHead, delivery_rate),
                std::mem::offset_of!(libc::tcp_info, tcpi_delivery_rate)
            );
        }
    }

    #[test]
    fn a_socket_that_sent_reports_acknowledged_bytes_and_a_rate() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut sender = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut receiver, _) = listener.accept().unwrap();
        let reader = std::thread::spawn(move || {
            let mut sink = vec![0u8; 1 << 20];
            let mut got = 0;
            while got < 8 << 20 {
                got += receiver.read(&mut sink).unwrap();
            }
        });
        let block = vec![7u8; 1 << 20];
        for _ in 0..8 {
            sender.write_all(&block).unwrap();
        }
        reader.join().unwrap();
        let info = tcp_delivery(&sender).unwrap();
        assert!(info.bytes_acked > 1 << 20, "{info:?}");
        assert!(info.delivery_rate > 0, "{info:?}");
        // A descriptor that is no TCP socket has no TCP_INFO.
        let file = tempfile::tempfile().unwrap();
        assert_eq!(tcp_delivery(&file), None);
    }
}
