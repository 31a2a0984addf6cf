//! The series behind the bandwidth plot (pure): the cumulative tier-byte curve and the
//! smoothed rate sampled from it, with idle gaps in staging kept out of the average.

use super::analysis::Pass;

/// The capacity-tier bandwidth over time: the cumulative byte curve `points` (t, bytes),
/// sampled on `n` evenly spaced times, each value the bytes gained over the preceding window
/// divided by the window. Gaps far longer than the usual spacing between events are idle
/// staging: the bytes reported after a gap are placed in the usual spacing before it, not
/// spread over the gap. Returns (t, bytes/s).
pub(super) fn smoothed_rate(points: &[(f64, f64)], n: usize) -> Vec<(f64, f64)> {
    if points.len() < 2 || n < 2 {
        return Vec::new();
    }
    let mut gaps: Vec<f64> = points
        .windows(2)
        .map(|w| w[1].0 - w[0].0)
        .filter(|d| *d > 0.0)
        .collect();
    if gaps.is_empty() {
        return Vec::new();
    }
    gaps.sort_by(f64::total_cmp);
    let typical = gaps[gaps.len() / 2];
    let mut curve: Vec<(f64, f64)> = vec![points[0]];
    for w in points.windows(2) {
        let (a, b) = (w[0], w[1]);
        if b.0 - a.0 > 3.0 * typical && b.1 > a.1 {
            curve.push((b.0 - typical, a.1));
        }
        curve.push(b);
    }
    let (start, end) = (curve[0].0, curve[curve.len() - 1].0);
    let span = end - start;
    if span <= 0.0 {
        return Vec::new();
    }
    let window = (3.0 * typical).max(span / 150.0);
    let at = |t: f64| -> f64 {
        // Piecewise-linear interpolation of the cumulative curve.
        let i = curve.partition_point(|p| p.0 <= t);
        if i == 0 {
            return curve[0].1;
        }
        if i == curve.len() {
            return curve[curve.len() - 1].1;
        }
        let (a, b) = (curve[i - 1], curve[i]);
        if b.0 <= a.0 {
            b.1
        } else {
            a.1 + (b.1 - a.1) * (t - a.0) / (b.0 - a.0)
        }
    };
    (0..n)
        .filter_map(|k| {
            let t = start + span * k as f64 / (n - 1) as f64;
            let from = (t - window).max(start);
            let len = t - from;
            (len > 0.0).then(|| (t, (at(t) - at(from)) / len))
        })
        .collect()
}

/// The cumulative bytes read through the mount: each pass adds its `view_bytes` over its
/// duration (when known), so [`smoothed_rate`] of it is the bandwidth that reading every
/// pass from the tier would have needed. Returns (t, bytes).
pub(super) fn mount_curve(passes: &[Pass]) -> Vec<(f64, f64)> {
    let mut curve: Vec<(f64, f64)> = Vec::new();
    let mut total = 0.0;
    for p in passes {
        let Some(vb) = p.view_bytes else { continue };
        let last_t = curve.last().map_or(f64::NEG_INFINITY, |c| c.0);
        if let Some(secs) = p.secs.filter(|s| *s > 0.0) {
            curve.push(((p.t - secs).max(last_t), total));
        }
        total += vb as f64;
        curve.push((p.t.max(last_t), total));
    }
    curve
}
