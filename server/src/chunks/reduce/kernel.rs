//! The arithmetic of `area`: element types, the types they are averaged in, and sums in
//! exactly the order numpy adds them, so the staged means match the reference bit for bit.
//!
//! * Integers average in `f64`, then round half to even and clip to their range.
//! * `f16` averages in `f32` (numpy's `result_type(float16, float32)`), `f32` in `f32`,
//!   `f64` in `f64`; complex in its own precision.
//! * A mean is `0 + sum` divided by the count, the division done in double precision
//!   and rounded to the working type (numpy divides by an `intp`, which promotes).
//! * A block reduced along the innermost axis of the array being reduced is summed the
//!   way numpy's `add.reduce` sums a contiguous run (pairwise, eight accumulators, see
//!   [`Work::pairwise`]); along any other axis, one term after another.

use half::f16;

/// A type the means are computed in.
pub(super) trait Work: Copy {
    /// The additive identity numpy starts a sum from (`+0`).
    const ZERO: Self;
    /// One addition, rounded to the working type.
    fn add(self, other: Self) -> Self;
    /// `sum / n` as numpy's `mean` divides.
    fn divide(sum: Self, n: u64) -> Self;
    /// The sum of a contiguous run in numpy's pairwise order (without the leading `0 +`).
    fn pairwise(values: &[Self]) -> Self;
    /// Where numpy splits a run of `n` terms in two halves it sums apart (`Some(left
    /// length)`), or `None` when it sums the run as one leaf ([`Work::pairwise`]).
    fn split(n: usize) -> Option<usize>;
}

/// The split of a run of `n` reals: past 128 terms, near the middle at a multiple of 8.
fn split_real(n: usize) -> Option<usize> {
    (n > 128).then(|| {
        let half = n / 2;
        half - half % 8
    })
}

/// The split of a run of `n` complex numbers: numpy splits the `2n` floats like reals.
fn split_complex(n: usize) -> Option<usize> {
    (n > 64).then(|| (n - n % 8) / 2)
}

/// numpy's pairwise sum of a run fed one term at a time, in bounded memory: the run's
/// split tree is known from its length, so finished leaves are summed at once and kept
/// only as the partial sums of their open ancestors (at most one per level). The result
/// is [`Work::pairwise`] of the whole run, bit for bit.
pub(super) struct Pairwise<W> {
    /// The terms of the leaf being filled.
    leaf: Vec<W>,
    /// How many terms the current leaf has.
    leaf_len: usize,
    /// Open splits, outermost first: the right half's length, and the left half's sum
    /// once it is known.
    open: Vec<(usize, Option<W>)>,
    /// The run's sum, once its last term is in.
    done: Option<W>,
}

impl<W: Work> Pairwise<W> {
    /// An empty sum; [`Pairwise::start`] gives it a length.
    pub(super) fn new() -> Self {
        Self {
            leaf: Vec::new(),
            leaf_len: 0,
            open: Vec::new(),
            done: None,
        }
    }

    /// Starts a run of `n` terms (forgetting any unfinished one).
    pub(super) fn start(&mut self, n: usize) {
        self.leaf.clear();
        self.open.clear();
        self.done = None;
        self.descend(n);
    }

    /// Opens the splits of a subtree of `n` terms down to its first leaf.
    fn descend(&mut self, mut n: usize) {
        while let Some(left) = W::split(n) {
            self.open.push((n - left, None));
            n = left;
        }
        self.leaf_len = n;
    }

    /// Adds the next term of the run.
    pub(super) fn push(&mut self, value: W) {
        self.leaf.push(value);
        if self.leaf.len() < self.leaf_len {
            return;
        }
        let mut sum = W::pairwise(&self.leaf);
        self.leaf.clear();
        while let Some((right, left)) = self.open.pop() {
            match left {
                Some(left) => sum = left.add(sum),
                None => {
                    self.open.push((right, Some(sum)));
                    self.descend(right);
                    return;
                }
            }
        }
        self.done = Some(sum);
    }

    /// The run's pairwise sum (all its terms pushed), without the leading `0 +`.
    pub(super) fn finish(&mut self) -> W {
        self.done.take().unwrap_or_else(|| W::pairwise(&self.leaf))
    }
}

/// numpy's pairwise sum of a run of reals: under 8 terms one after another; up to 128
/// in eight interleaved accumulators combined as `((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7))`
/// then the remainder; longer runs split near the middle at a multiple of 8.
fn pairwise_real<W: Copy>(values: &[W], zero: W, add: fn(W, W) -> W) -> W {
    let n = values.len();
    if n < 8 {
        values.iter().fold(zero, |acc, &v| add(acc, v))
    } else if n <= 128 {
        let mut r = [values[0]; 8];
        r.copy_from_slice(&values[..8]);
        let mut i = 8;
        while i < n - n % 8 {
            for (j, acc) in r.iter_mut().enumerate() {
                *acc = add(*acc, values[i + j]);
            }
            i += 8;
        }
        let mut res = add(
            add(add(r[0], r[1]), add(r[2], r[3])),
            add(add(r[4], r[5]), add(r[6], r[7])),
        );
        for &v in &values[i..] {
            res = add(res, v);
        }
        res
    } else {
        let mut half = n / 2;
        half -= half % 8;
        add(
            pairwise_real(&values[..half], zero, add),
            pairwise_real(&values[half..], zero, add),
        )
    }
}

impl Work for f32 {
    const ZERO: Self = 0.0;
    fn add(self, other: Self) -> Self {
        self + other
    }
    fn divide(sum: Self, n: u64) -> Self {
        (f64::from(sum) / n as f64) as f32
    }
    fn pairwise(values: &[Self]) -> Self {
        pairwise_real(values, -0.0, |a, b| a + b)
    }
    fn split(n: usize) -> Option<usize> {
        split_real(n)
    }
}

impl Work for f64 {
    const ZERO: Self = 0.0;
    fn add(self, other: Self) -> Self {
        self + other
    }
    fn divide(sum: Self, n: u64) -> Self {
        sum / n as f64
    }
    fn pairwise(values: &[Self]) -> Self {
        pairwise_real(values, -0.0, |a, b| a + b)
    }
    fn split(n: usize) -> Option<usize> {
        split_real(n)
    }
}

/// A complex number in working precision `F`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Complex<F> {
    re: F,
    im: F,
}

/// numpy's pairwise sum of a run of complex numbers: the real routine over the
/// interleaved floats, so blocks count 4 numbers where the real one counts 8.
fn pairwise_complex<F: Copy>(values: &[Complex<F>], zero: F, add: fn(F, F) -> F) -> Complex<F> {
    let n = values.len();
    let sum = |a: Complex<F>, b: Complex<F>| Complex {
        re: add(a.re, b.re),
        im: add(a.im, b.im),
    };
    if n < 4 {
        values
            .iter()
            .fold(Complex { re: zero, im: zero }, |acc, &v| sum(acc, v))
    } else if n <= 64 {
        let mut r = [values[0], values[1], values[2], values[3]];
        let mut i = 4;
        while i < n - n % 4 {
            for (j, acc) in r.iter_mut().enumerate() {
                *acc = sum(*acc, values[i + j]);
            }
            i += 4;
        }
        let mut res = sum(sum(r[0], r[1]), sum(r[2], r[3]));
        for &v in &values[i..] {
            res = sum(res, v);
        }
        res
    } else {
        // numpy splits the float count n·2 at half, less its remainder mod 8.
        let mut half_floats = n;
        half_floats -= half_floats % 8;
        let half = half_floats / 2;
        sum(
            pairwise_complex(&values[..half], zero, add),
            pairwise_complex(&values[half..], zero, add),
        )
    }
}

/// numpy's complex division by a real count `(n, 0)` in double precision: the ratio
/// form `((re + im·0)·(1/n), (im − re·0)·(1/n))`.
fn divide_complex(re: f64, im: f64, n: u64) -> (f64, f64) {
    let scale = 1.0 / (n as f64 + 0.0 * 0.0);
    ((re + im * 0.0) * scale, (im - re * 0.0) * scale)
}

impl Work for Complex<f32> {
    const ZERO: Self = Complex { re: 0.0, im: 0.0 };
    fn add(self, other: Self) -> Self {
        Complex {
            re: self.re + other.re,
            im: self.im + other.im,
        }
    }
    fn divide(sum: Self, n: u64) -> Self {
        let (re, im) = divide_complex(f64::from(sum.re), f64::from(sum.im), n);
        Complex {
            re: re as f32,
            im: im as f32,
        }
    }
    fn pairwise(values: &[Self]) -> Self {
        pairwise_complex(values, -0.0, |a, b| a + b)
    }
    fn split(n: usize) -> Option<usize> {
        split_complex(n)
    }
}

impl Work for Complex<f64> {
    const ZERO: Self = Complex { re: 0.0, im: 0.0 };
    fn add(self, other: Self) -> Self {
        Complex {
            re: self.re + other.re,
            im: self.im + other.im,
        }
    }
    fn divide(sum: Self, n: u64) -> Self {
        let (re, im) = divide_complex(sum.re, sum.im, n);
        Complex { re, im }
    }
    fn pairwise(values: &[Self]) -> Self {
        pairwise_complex(values, -0.0, |a, b| a + b)
    }
    fn split(n: usize) -> Option<usize> {
        split_complex(n)
    }
}

/// An element type of a source: how its bytes become a working value and back.
pub(super) trait Elem {
    /// The type its means are computed in.
    type W: Work;
    /// Bytes per element.
    const SIZE: usize;
    /// The element in `bytes` (exactly `SIZE` long) as a working value.
    fn load(bytes: &[u8], big_endian: bool) -> Self::W;
    /// A mean back as an element of this type, into `out` (exactly `SIZE` long).
    fn store(value: Self::W, out: &mut [u8], big_endian: bool);
}

/// An integer element, for the exact block-sum path of `area`.
pub(super) trait IntElem: Elem<W = f64> {
    /// The largest magnitude a value can have.
    const MAX_ABS: u64;
    /// The element in `bytes` as an `i64` (exact whenever the block-sum path is taken).
    fn load_i64(bytes: &[u8], big_endian: bool) -> i64;
}

/// `N` bytes of a slice known to be `N` long.
fn word<const N: usize>(bytes: &[u8]) -> [u8; N] {
    let mut w = [0u8; N];
    w.copy_from_slice(bytes);
    w
}

macro_rules! integer_elem {
    ($name:ident, $t:ty) => {
        /// An integer element: averaged in `f64`, rounded half to even and clipped.
        pub(super) struct $name;
        impl Elem for $name {
            type W = f64;
            const SIZE: usize = std::mem::size_of::<$t>();
            fn load(bytes: &[u8], big_endian: bool) -> f64 {
                let w = word(bytes);
                (if big_endian {
                    <$t>::from_be_bytes(w)
                } else {
                    <$t>::from_le_bytes(w)
                }) as f64
            }
            fn store(value: f64, out: &mut [u8], big_endian: bool) {
                let v = value
                    .round_ties_even()
                    .clamp(<$t>::MIN as f64, <$t>::MAX as f64) as $t;
                out.copy_from_slice(&if big_endian {
                    v.to_be_bytes()
                } else {
                    v.to_le_bytes()
                });
            }
        }
        impl IntElem for $name {
            const MAX_ABS: u64 = {
                let (min, max) = (-(<$t>::MIN as i128), <$t>::MAX as i128);
                (if min > max { min } else { max }) as u64
            };
            fn load_i64(bytes: &[u8], big_endian: bool) -> i64 {
                let w = word(bytes);
                (if big_endian {
                    <$t>::from_be_bytes(w)
                } else {
                    <$t>::from_le_bytes(w)
                }) as i64
            }
        }
    };
}

integer_elem!(U8, u8);
integer_elem!(U16, u16);
integer_elem!(U32, u32);
integer_elem!(U64, u64);
integer_elem!(I8, i8);
integer_elem!(I16, i16);
integer_elem!(I32, i32);
integer_elem!(I64, i64);

/// `float16`, averaged in `f32` and rounded back to nearest, ties to even.
pub(super) struct F16;
impl Elem for F16 {
    type W = f32;
    const SIZE: usize = 2;
    fn load(bytes: &[u8], big_endian: bool) -> f32 {
        let w = word(bytes);
        f16::from_bits(if big_endian {
            u16::from_be_bytes(w)
        } else {
            u16::from_le_bytes(w)
        })
        .to_f32()
    }
    fn store(value: f32, out: &mut [u8], big_endian: bool) {
        let bits = f16::from_f32(value).to_bits();
        out.copy_from_slice(&if big_endian {
            bits.to_be_bytes()
        } else {
            bits.to_le_bytes()
        });
    }
}

macro_rules! float_elem {
    ($name:ident, $t:ty) => {
        /// A float element, averaged in its own precision.
        pub(super) struct $name;
        impl Elem for $name {
            type W = $t;
            const SIZE: usize = std::mem::size_of::<$t>();
            fn load(bytes: &[u8], big_endian: bool) -> $t {
                let w = word(bytes);
                if big_endian {
                    <$t>::from_be_bytes(w)
                } else {
                    <$t>::from_le_bytes(w)
                }
            }
            fn store(value: $t, out: &mut [u8], big_endian: bool) {
                out.copy_from_slice(&if big_endian {
                    value.to_be_bytes()
                } else {
                    value.to_le_bytes()
                });
            }
        }
    };
}

float_elem!(F32, f32);
float_elem!(F64, f64);

macro_rules! complex_elem {
    ($name:ident, $t:ty) => {
        /// A complex element (two floats, real first), averaged in its own precision.
        pub(super) struct $name;
        impl Elem for $name {
            type W = Complex<$t>;
            const SIZE: usize = 2 * std::mem::size_of::<$t>();
            fn load(bytes: &[u8], big_endian: bool) -> Complex<$t> {
                let half = Self::SIZE / 2;
                let part = |b: &[u8]| {
                    let w = word(b);
                    if big_endian {
                        <$t>::from_be_bytes(w)
                    } else {
                        <$t>::from_le_bytes(w)
                    }
                };
                Complex {
                    re: part(&bytes[..half]),
                    im: part(&bytes[half..]),
                }
            }
            fn store(value: Complex<$t>, out: &mut [u8], big_endian: bool) {
                let half = Self::SIZE / 2;
                let put = |v: $t| {
                    if big_endian {
                        v.to_be_bytes()
                    } else {
                        v.to_le_bytes()
                    }
                };
                out[..half].copy_from_slice(&put(value.re));
                out[half..].copy_from_slice(&put(value.im));
            }
        }
    };
}

complex_elem!(C64, f32);
complex_elem!(C128, f64);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairwise_sums_follow_numpy_order() {
        // Under 8 terms: left to right.
        let v = [1e8f32, 1.0, -1e8, 1.0];
        assert_eq!(f32::pairwise(&v), ((1e8f32 + 1.0) + -1e8) + 1.0);
        // 8..=128 terms: eight accumulators, then the remainder.
        let v: Vec<f32> = (0..10).map(|i| 1.0 + i as f32 * 1e-7).collect();
        let r: Vec<f32> = (0..8).map(|j| v[j]).collect();
        let expect =
            ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7])) + v[8] + v[9];
        assert_eq!(f32::pairwise(&v), expect);
    }

    /// A run fed term by term sums to numpy's pairwise sum of the whole run, bit for bit,
    /// across leaf sizes and split depths (reals split past 128 terms, complex past 64).
    #[test]
    fn streamed_pairwise_sums_equal_the_whole_run() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / 3.7 - 1000.0
        };
        let mut real = Pairwise::<f32>::new();
        let mut complex = Pairwise::<Complex<f64>>::new();
        for n in (1..300).chain([1000, 1031, 4096, 10_007, 70_001]) {
            let values: Vec<f32> = (0..n).map(|_| next()).collect();
            real.start(n);
            values.iter().for_each(|&v| real.push(v));
            assert_eq!(
                real.finish().to_bits(),
                f32::pairwise(&values).to_bits(),
                "{n}"
            );
            let pairs: Vec<Complex<f64>> = values
                .chunks(2)
                .map(|c| Complex {
                    re: f64::from(c[0]) * 1e-3,
                    im: f64::from(c[c.len() - 1]),
                })
                .collect();
            complex.start(pairs.len());
            pairs.iter().for_each(|&v| complex.push(v));
            assert_eq!(complex.finish(), Complex::<f64>::pairwise(&pairs), "{n}");
        }
    }

    #[test]
    fn integers_round_half_to_even_and_clip() {
        let mut out = [0u8; 2];
        U16::store(2.5, &mut out, false);
        assert_eq!(u16::from_le_bytes(out), 2);
        U16::store(3.5, &mut out, true);
        assert_eq!(u16::from_be_bytes(out), 4);
        let mut out = [0u8; 1];
        I8::store(-300.0, &mut out, false);
        assert_eq!(out[0] as i8, -128);
    }

    #[test]
    fn f16_widens_and_rounds_back() {
        let one = f16::from_f32(1.0).to_bits().to_be_bytes();
        assert_eq!(F16::load(&one, true), 1.0);
        let mut out = [0u8; 2];
        F16::store(1.0 + 2f32.powi(-11), &mut out, false);
        assert_eq!(
            u16::from_le_bytes(out),
            f16::from_f32(1.0).to_bits(),
            "ties to even"
        );
    }
}
