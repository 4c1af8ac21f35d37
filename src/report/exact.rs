//! The exact arithmetic under the report: fixed-point shares that
//! telescope, largest-remainder rounding, 256-bit products.

use super::*;

/// A part's time units from the epoch up to `t`, for a part of `weight`
/// in `total`: `t × SCALE × weight / total` rounded down (towards the past
/// before the epoch). One origin for every segment, so that differences
/// telescope; the epoch, so that today's products stay inside u128.
pub(super) fn ms_until(t: i64, weight: u128, total: u128) -> i128 {
    let (q, r) = mul_div(SCALE * u128::from(t.unsigned_abs()), weight, total);
    // q <= SCALE × |t| < 2^96.
    if t >= 0 {
        q as i128
    } else {
        -(q as i128) - i128::from(r > 0)
    }
}

/// Length of `[a, b)` in ms; i128 so even `i64::MIN..i64::MAX` fits.
pub(super) fn span(a: i64, b: i64) -> u128 {
    (i128::from(b) - i128::from(a)).max(0) as u128
}

pub(super) fn to_u64(x: u128) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

/// Splits `total` in proportion to `weights` into integers that sum to
/// `total` exactly (largest-remainder method): each part is its exact share
/// rounded down, and the units left over go to the largest remainders, ties
/// to the lower index. A part never exceeds its exact share rounded up, and a
/// zero weight gets zero. All zero weights get nothing.
pub(super) fn apportion(total: u128, weights: &[u128]) -> Vec<u128> {
    let sum: u128 = weights.iter().sum();
    if sum == 0 {
        return vec![0; weights.len()];
    }
    let mut parts = Vec::with_capacity(weights.len());
    let mut rems = Vec::with_capacity(weights.len());
    for &wt in weights {
        let (q, r) = mul_div(total, wt, sum);
        parts.push(q);
        rems.push(r);
    }
    // Fewer than weights.len() units are left, one per largest remainder.
    let left = total - parts.iter().sum::<u128>();
    if left > 0 {
        let mut order: Vec<usize> = (0..weights.len()).collect();
        order.sort_by(|&x, &y| rems[y].cmp(&rems[x]).then(x.cmp(&y)));
        for &i in order.iter().take(left as usize) {
            parts[i] += 1;
        }
    }
    parts
}

/// `(a × b / d, a × b % d)` exactly, with a 256-bit product where u128
/// overflows. Requires `d > 0` and a quotient that fits u128 (true whenever
/// `b <= d`, as in every call here).
pub(super) fn mul_div(a: u128, b: u128, d: u128) -> (u128, u128) {
    // The common cases of a sweep, without a division: a segment that is
    // its measured interval whole (b = d) or starts it (a = 0), a part
    // that is the whole GPU.
    if b == d {
        return (a, 0);
    }
    if a == 0 || b == 0 {
        return (0, 0);
    }
    if let Some(p) = a.checked_mul(b) {
        return (p / d, p % d);
    }
    let (hi, lo) = wide_mul(a, b);
    debug_assert!(hi < d, "quotient does not fit u128");
    // Long division, one bit of `lo` at a time; `hi < d` keeps r < d.
    let mut r = hi;
    let mut q: u128 = 0;
    for bit in (0..128).rev() {
        let carry = r >> 127;
        r = (r << 1) | ((lo >> bit) & 1);
        q <<= 1;
        // With the carry the true value is >= 2^128 > d; wrapping gives it less d.
        if carry == 1 || r >= d {
            r = r.wrapping_sub(d);
            q |= 1;
        }
    }
    (q, r)
}

/// The 256-bit product of two u128, as (high, low) halves.
pub(super) fn wide_mul(a: u128, b: u128) -> (u128, u128) {
    const LOW: u128 = u64::MAX as u128;
    let (a1, a0) = (a >> 64, a & LOW);
    let (b1, b0) = (b >> 64, b & LOW);
    let (p00, p01, p10, p11) = (a0 * b0, a0 * b1, a1 * b0, a1 * b1);
    // The middle column, below 3 × 2^64, carries into the high half.
    let mid = (p00 >> 64) + (p01 & LOW) + (p10 & LOW);
    let lo = (p00 & LOW) | (mid << 64);
    let hi = p11 + (p01 >> 64) + (p10 >> 64) + (mid >> 64);
    (hi, lo)
}
