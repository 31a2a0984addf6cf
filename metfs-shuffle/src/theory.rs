//! The paper's predictions (paper 002, Theorem 1 and Theorem 3), in the forms the tests and the
//! benchmark compare measurements with.
//!
//! Theorem 1 gives the number of broadcasts of the coded scheme as `q` grows:
//! `R_c = q/(np)² · ((1−p)^(n+1) + (n−1)p(1−p) − (1−p)²)` with `p = (s − q/n)/(q − q/n)`.
//! The uncoded scheme sends `q(1 − α)` unicasts, where `α = 1/n + p(1 − 1/n)` is the fraction a
//! node holds, so `q(1−α) = q(1 − 1/n)(1 − p)`. Dividing, and writing the sum over table sizes
//! that Theorem 1 closes, the ratio is
//!
//! `R_c / (q(1−α)) = E[1/(K + 2)]`, with `K ~ Binomial(n − 2, p)`:
//!
//! a sample that must move is held by its old owner and by each of the other `n − 2` nodes
//! (all but the new owner) with probability `p`, so it lands in a table of `K + 2` nodes, and a
//! row of such a table carries `K + 2` samples in one packet. This form has no `0/0` at
//! `p = 0` (where Theorem 1's printed form does; its limit is `1/2`, pairs only) and no
//! cancellation at large `n`, so [`coded_ratio`] computes it; a test checks it against the
//! printed closed form.
//!
//! Theorem 3: a packet pseudo-broadcast to `n` nodes by scatter-then-ring takes
//! `(2n − 1)/n` unicast times.

/// The paper's `p`: the probability that a node holds a sample outside its share, for a node
/// holding the fraction `alpha` of the dataset. `None` unless `1/n ≤ alpha ≤ 1` and `n ≥ 2`.
pub fn extra_probability(nodes: u32, alpha: f64) -> Option<f64> {
    if nodes < 2 {
        return None;
    }
    let share = 1.0 / f64::from(nodes);
    if !(share - 1e-12..=1.0).contains(&alpha) {
        return None;
    }
    Some(((alpha - share) / (1.0 - share)).clamp(0.0, 1.0))
}

/// The fraction a node holds when it keeps each sample outside its share with probability `p`:
/// `α = 1/n + p(1 − 1/n)`.
pub fn alpha(nodes: u32, p: f64) -> f64 {
    let share = 1.0 / f64::from(nodes.max(1));
    share + p * (1.0 - share)
}

/// Theorem 1's coded/uncoded ratio `R_c / (q(1−α)) = E[1/(K + 2)]`, `K ~ Bin(n − 2, p)`
/// (see the module docs). `n ≥ 2`, `0 ≤ p ≤ 1`.
pub fn coded_ratio(nodes: u32, p: f64) -> f64 {
    assert!(nodes >= 2, "a shuffle needs two nodes");
    assert!((0.0..=1.0).contains(&p), "p = {p} is not a probability");
    let m = nodes - 2;
    if p == 0.0 {
        return 0.5;
    }
    if p == 1.0 {
        return 1.0 / f64::from(nodes);
    }
    // The binomial pmf in log space, so that large n neither overflows nor underflows.
    let (lp, lq) = (p.ln(), (1.0 - p).ln());
    let mut ln_choose = 0.0f64;
    let mut sum = 0.0;
    for k in 0..=m {
        if k > 0 {
            ln_choose += f64::from(m - k + 1).ln() - f64::from(k).ln();
        }
        let pmf = (ln_choose + f64::from(k) * lp + f64::from(m - k) * lq).exp();
        sum += pmf / f64::from(k + 2);
    }
    sum
}

/// Theorem 1's number of broadcasts `R_c` for `q` unit samples, computed as
/// `q(1 − 1/n)(1 − p) · E[1/(K + 2)]`.
pub fn coded_broadcasts(q: f64, nodes: u32, p: f64) -> f64 {
    uncoded_unicasts(q, nodes, p) * coded_ratio(nodes, p)
}

/// Theorem 1 exactly as printed: `q/(np)² · ((1−p)^(n+1) + (n−1)p(1−p) − (1−p)²)`, `p > 0`.
pub fn coded_broadcasts_as_printed(q: f64, nodes: u32, p: f64) -> f64 {
    let n = f64::from(nodes);
    let r = 1.0 - p;
    q / (n * p).powi(2) * (r.powi(nodes as i32 + 1) + (n - 1.0) * p * r - r * r)
}

/// The uncoded scheme's unicasts, `q(1 − α) = q(1 − 1/n)(1 − p)`.
pub fn uncoded_unicasts(q: f64, nodes: u32, p: f64) -> f64 {
    q * (1.0 - alpha(nodes, p))
}

/// Theorem 3: the time of one pseudo-broadcast to `group` nodes, in unicast times of the
/// whole packet: `(2m − 1)/m`.
pub fn pseudo_broadcast_time(group: u32) -> f64 {
    let m = f64::from(group.max(1));
    (2.0 * m - 1.0) / m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ratio_matches_theorem_1_as_printed() {
        for n in [2u32, 3, 4, 8, 20, 64] {
            for p in [0.01, 0.1, 1.0 / 3.0, 0.5, 0.9, 0.99] {
                let ours = coded_broadcasts(1e6, n, p);
                let printed = coded_broadcasts_as_printed(1e6, n, p);
                assert!(
                    (ours - printed).abs() / printed < 1e-9,
                    "n {n} p {p}: {ours} {printed}"
                );
            }
        }
    }

    #[test]
    fn limits() {
        // Pairs only: each packet carries two samples.
        assert_eq!(coded_ratio(4, 0.0), 0.5);
        assert!((coded_ratio(4, 1e-9) - 0.5).abs() < 1e-6);
        // Everyone holds everything but its own: n samples per packet.
        assert_eq!(coded_ratio(5, 1.0), 0.2);
        assert_eq!(coded_ratio(2, 0.3), 0.5);
        // The paper's remark: R_c → q(1 − α)/(αn) for large n.
        let (n, p) = (1000u32, 0.3);
        let a = alpha(n, p);
        assert!((coded_ratio(n, p) * a * f64::from(n) - 1.0).abs() < 0.01);
        // No overflow at large n.
        assert!(coded_ratio(5000, 0.999).is_finite());
    }

    #[test]
    fn p_from_alpha_and_back() {
        assert_eq!(extra_probability(4, 0.25), Some(0.0));
        assert!((extra_probability(4, 0.5).unwrap() - 1.0 / 3.0).abs() < 1e-12);
        assert!((alpha(20, extra_probability(20, 0.325).unwrap()) - 0.325).abs() < 1e-12);
        assert_eq!(extra_probability(4, 0.2), None);
        assert_eq!(extra_probability(1, 0.5), None);
        assert!((pseudo_broadcast_time(4) - 1.75).abs() < 1e-12);
    }
}
