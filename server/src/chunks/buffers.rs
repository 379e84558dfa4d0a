//! Reusable decode buffers: a fresh 64 MiB allocation per chunk costs more in
//! page faults than the copy into it, so decode buffers are kept and reused.

use parking_lot::Mutex;

/// A bounded pool of byte buffers.
pub struct BufferPool {
    free: Mutex<Vec<Vec<u8>>>,
    keep: usize,
}

impl BufferPool {
    /// A pool that keeps at most `keep` idle buffers.
    pub fn new(keep: usize) -> Self {
        Self {
            free: Mutex::new(Vec::new()),
            keep,
        }
    }

    /// A buffer of exactly `len` bytes (contents unspecified), reusing an idle one when possible.
    pub fn take(&self, len: usize) -> PooledBuffer<'_> {
        let mut buf = self.free.lock().pop().unwrap_or_default();
        if buf.len() < len {
            // Grow once; later takes of the same or smaller size reuse the touched pages.
            buf.resize(len, 0);
        }
        PooledBuffer {
            pool: self,
            buf,
            len,
        }
    }
}

/// A buffer on loan from a [`BufferPool`]; returned on drop.
pub struct PooledBuffer<'a> {
    pool: &'a BufferPool,
    buf: Vec<u8>,
    len: usize,
}

impl PooledBuffer<'_> {
    /// The requested bytes.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.buf[..self.len]
    }

    /// The requested bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Drop for PooledBuffer<'_> {
    fn drop(&mut self) {
        let mut free = self.pool.free.lock();
        if free.len() < self.pool.keep {
            free.push(std::mem::take(&mut self.buf));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_reused() {
        let pool = BufferPool::new(2);
        let ptr = {
            let mut b = pool.take(1024);
            b.as_mut_slice()[0] = 1;
            b.as_slice().as_ptr()
        };
        let b = pool.take(512);
        assert_eq!(b.as_slice().as_ptr(), ptr);
        assert_eq!(b.as_slice().len(), 512);
    }
}
