//! The balancing step of the permuting strategies: [`balance`] colours samples with `k`
//! colours so that class counts, sample counts and byte totals per colour are as even as the
//! module docs of the planner prove (remainders by a proper edge-colouring built with
//! alternating paths, full rounds by sorted blocks). Buffers live in [`Scratch`] and are
//! reused, so planning allocates per plan, never per sample.

use std::collections::HashMap;

use super::rng::PlanRng;
use super::NONE;

/// One remainder sample in the sweep colouring.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rem {
    pub(super) size: u64,
    pub(super) group: u32,
    pub(super) id: u32,
}

/// (group, colour) → remainder edge: dense when small enough, hashed otherwise, so a huge
/// `groups × k` never allocates a huge table.
#[derive(Debug, Default)]
pub(super) struct GroupTable {
    pub(super) k: usize,
    pub(super) dense: Option<Vec<u32>>,
    pub(super) sparse: HashMap<u64, u32>,
}

/// Largest dense (group, colour) table, in entries.
pub(super) const DENSE_LIMIT: usize = 1 << 24;

impl GroupTable {
    pub(super) fn reset(&mut self, groups: usize, k: usize) {
        self.k = k;
        match groups.checked_mul(k).filter(|&e| e <= DENSE_LIMIT) {
            Some(entries) => {
                let mut v = self.dense.take().unwrap_or_default();
                v.clear();
                v.resize(entries, NONE);
                self.dense = Some(v);
            }
            None => {
                self.dense = None;
                self.sparse.clear();
            }
        }
    }
    pub(super) fn get(&self, g: u32, c: u32) -> u32 {
        match &self.dense {
            Some(v) => v[g as usize * self.k + c as usize],
            None => *self
                .sparse
                .get(&(u64::from(g) * self.k as u64 + u64::from(c)))
                .unwrap_or(&NONE),
        }
    }
    pub(super) fn set(&mut self, g: u32, c: u32, e: u32) {
        match &mut self.dense {
            Some(v) => v[g as usize * self.k + c as usize] = e,
            None => {
                let key = u64::from(g) * self.k as u64 + u64::from(c);
                if e == NONE {
                    self.sparse.remove(&key);
                } else {
                    self.sparse.insert(key, e);
                }
            }
        }
    }
}

/// Buffers [`balance`] reuses across calls, so planning allocates per plan, not per sample.
#[derive(Debug, Default)]
pub(super) struct Scratch {
    pub(super) loads: Vec<u64>,
    pub(super) tie: Vec<u32>,
    pub(super) rem: Vec<Rem>,
    pub(super) rem_color: Vec<u32>,
    pub(super) sweep_tab: Vec<u32>,
    pub(super) group_local: Vec<u32>,
    pub(super) group_tab: GroupTable,
    pub(super) free: Vec<u32>,
    pub(super) path: Vec<u32>,
    pub(super) order: Vec<u32>,
    pub(super) pairs: Vec<(u64, u32, u32)>,
    pub(super) bsum: Vec<u64>,
    pub(super) border: Vec<u32>,
    pub(super) corder: Vec<u32>,
    pub(super) bcolor: Vec<u32>,
}

/// Colours `ids` with `k` colours (see the module docs for the three guarantees and the
/// proof), calling `out(id, colour)` once per sample. Group `g` is
/// `ids[bounds[g]..bounds[g + 1]]`; groups are reordered in place.
pub(super) fn balance(
    k: u32,
    ids: &mut [u32],
    bounds: &[usize],
    sizes: &[u64],
    rng: &mut PlanRng,
    sc: &mut Scratch,
    mut out: impl FnMut(u32, u32),
) {
    let ku = k as usize;
    let groups = bounds.len().saturating_sub(1);
    if ku <= 1 {
        ids.iter().for_each(|&id| out(id, 0));
        return;
    }
    sc.loads.clear();
    sc.loads.resize(ku, 0);
    // Equal loads are broken by a random colour order, so no mini-epoch or node is always
    // first in line for the heaviest bundle.
    sc.tie.clear();
    sc.tie.extend(0..k);
    rng.shuffle(&mut sc.tie);

    // Phase 1: a random n_c mod k samples of each class, coloured by sorted sweeps.
    sc.rem.clear();
    for g in 0..groups {
        let slice = &mut ids[bounds[g]..bounds[g + 1]];
        rng.shuffle(slice);
        let r = slice.len() % ku;
        sc.rem.extend(slice[..r].iter().map(|&id| Rem {
            size: sizes[id as usize],
            group: g as u32,
            id,
        }));
    }
    sc.rem
        .sort_unstable_by(|a, b| b.size.cmp(&a.size).then(a.id.cmp(&b.id)));
    color_remainders(k, groups, sc, rng);
    for (r, &c) in sc.rem.iter().zip(&sc.rem_color) {
        sc.loads[c as usize] += r.size;
        out(r.id, c);
    }

    // Phase 2: the full rounds of each class, as size-stratified bundles matched
    // largest-to-lightest.
    let mut order = std::mem::take(&mut sc.order);
    order.clear();
    order.extend(0..groups as u32);
    rng.shuffle(&mut order);
    for &g in &order {
        let slice = &mut ids[bounds[g as usize]..bounds[g as usize + 1]];
        let r = slice.len() % ku;
        let full = &mut slice[r..];
        if full.is_empty() {
            continue;
        }
        // Ties keep the shuffled order, so equal sizes still land in random bundles.
        sc.pairs.clear();
        sc.pairs.extend(
            full.iter()
                .enumerate()
                .map(|(i, &id)| (sizes[id as usize], i as u32, id)),
        );
        sc.pairs
            .sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        for (dst, p) in full.iter_mut().zip(&sc.pairs) {
            *dst = p.2;
        }
        for block in full.chunks_mut(ku) {
            rng.shuffle(block);
        }
        colour_bundles(k, full, sizes, sc, &mut out);
    }
    sc.order = order;
}

/// Colours one class's full rounds, `full` already cut into `k` size-stratified bundles
/// (position `i` is in bundle `i % k`): the heaviest bundle goes to the lightest-loaded colour
/// (ties by the shuffled colour order), and the loads grow by what each colour got.
fn colour_bundles(
    k: u32,
    full: &[u32],
    sizes: &[u64],
    sc: &mut Scratch,
    out: &mut impl FnMut(u32, u32),
) {
    let ku = k as usize;
    sc.bsum.clear();
    sc.bsum.resize(ku, 0);
    for (i, &id) in full.iter().enumerate() {
        sc.bsum[i % ku] += sizes[id as usize];
    }
    sc.border.clear();
    sc.border.extend(0..k);
    sc.border.sort_unstable_by(|&a, &b| {
        sc.bsum[b as usize]
            .cmp(&sc.bsum[a as usize])
            .then(a.cmp(&b))
    });
    sc.corder.clear();
    sc.corder.extend(0..k);
    sc.corder.sort_unstable_by(|&a, &b| {
        (sc.loads[a as usize], sc.tie[a as usize]).cmp(&(sc.loads[b as usize], sc.tie[b as usize]))
    });
    sc.bcolor.clear();
    sc.bcolor.resize(ku, 0);
    for (&b, &c) in sc.border.iter().zip(&sc.corder) {
        sc.bcolor[b as usize] = c;
    }
    for (i, &id) in full.iter().enumerate() {
        out(id, sc.bcolor[i % ku]);
    }
    for (b, &c) in sc.bcolor.iter().enumerate() {
        sc.loads[c as usize] += sc.bsum[b];
    }
}

/// Properly edge-colours the remainder multigraph (sweeps of `k` consecutive entries of
/// `sc.rem` × groups) with `k` colours into `sc.rem_color`.
pub(super) fn color_remainders(k: u32, groups: usize, sc: &mut Scratch, rng: &mut PlanRng) {
    let ku = k as usize;
    let r = sc.rem.len();
    sc.rem_color.clear();
    sc.rem_color.resize(r, NONE);
    if r == 0 {
        return;
    }
    let sweeps = r.div_ceil(ku);
    sc.sweep_tab.clear();
    sc.sweep_tab.resize(sweeps * ku, NONE);
    sc.group_local.clear();
    sc.group_local.resize(groups, NONE);
    let mut local = 0u32;
    for e in &sc.rem {
        let slot = &mut sc.group_local[e.group as usize];
        if *slot == NONE {
            *slot = local;
            local += 1;
        }
    }
    sc.group_tab.reset(local as usize, ku);
    for s in 0..sweeps {
        // The sweep's free colours in random order: the first fit is a random fit.
        sc.free.clear();
        sc.free.extend(0..k);
        rng.shuffle(&mut sc.free);
        for e in s * ku..r.min((s + 1) * ku) {
            let g = sc.group_local[sc.rem[e].group as usize];
            let fit = sc.free.iter().position(|&c| sc.group_tab.get(g, c) == NONE);
            let c = match fit {
                Some(p) => sc.free.swap_remove(p),
                None => {
                    // Every colour free in this sweep is taken by the group: free one with an
                    // alternating path (König). `b` exists since a group has < k remainders.
                    let a = sc.free.swap_remove(0);
                    let start = rng.below(k);
                    let b = (0..k)
                        .map(|t| (start + t) % k)
                        .find(|&c| sc.group_tab.get(g, c) == NONE)
                        .expect("a group has fewer remainder samples than colours");
                    flip_path(sc, g, a, b, ku);
                    a
                }
            };
            sc.rem_color[e] = c;
            sc.sweep_tab[s * ku + c as usize] = e as u32;
            sc.group_tab.set(g, c, e as u32);
        }
    }
}

/// Swaps colours `a` and `b` along the `a`/`b` path that starts at group `g` with its
/// `a`-edge. `b` is free at `g`, so the path is simple and cannot reach the current sweep
/// (where `a` is free); afterwards `a` is free at both.
pub(super) fn flip_path(sc: &mut Scratch, g: u32, a: u32, b: u32, ku: usize) {
    #[cfg(test)]
    super::tests::FLIPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    sc.path.clear();
    let (mut at_group, mut v, mut col) = (true, g, a);
    loop {
        let e = if at_group {
            sc.group_tab.get(v, col)
        } else {
            sc.sweep_tab[v as usize * ku + col as usize]
        };
        if e == NONE {
            break;
        }
        sc.path.push(e);
        v = if at_group {
            (e as usize / ku) as u32
        } else {
            sc.group_local[sc.rem[e as usize].group as usize]
        };
        at_group = !at_group;
        col = if col == a { b } else { a };
    }
    for &e in &sc.path {
        let (c, gl) = (
            sc.rem_color[e as usize],
            sc.group_local[sc.rem[e as usize].group as usize],
        );
        sc.sweep_tab[(e as usize / ku) * ku + c as usize] = NONE;
        sc.group_tab.set(gl, c, NONE);
    }
    for &e in &sc.path {
        let gl = sc.group_local[sc.rem[e as usize].group as usize];
        let c = if sc.rem_color[e as usize] == a { b } else { a };
        sc.rem_color[e as usize] = c;
        sc.sweep_tab[(e as usize / ku) * ku + c as usize] = e;
        sc.group_tab.set(gl, c, e);
    }
}
