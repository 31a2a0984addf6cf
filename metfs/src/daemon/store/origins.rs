//! A slot's hard-linked samples and their *origins*: for each sample a staging linked from
//! another slot, the slot whose fetch made the file (every name of one sample with one origin
//! is one file on disk).
//!
//! A slot of 500,000 samples may link all of them, so the record is kept flat: the origins'
//! names once each (a handful of slots, deleted ones included while their files live on as
//! links) and one `(sample, name)` pair of indices per link, sorted by sample. That is 8 bytes
//! a link where a map from sample to a shared name took 25 bytes a bucket, up to 50 after its
//! doubling (13 MB at 1M catalogued files, docs/BENCHMARKS.md "Scale"). A lookup is a binary
//! search; the store's byte counts walk the pairs in order.

use std::sync::Arc;

/// The links of one slot (module docs). Each sample appears at most once.
#[derive(Debug, Default, Clone)]
pub(super) struct Origins {
    /// The origins' names, each once.
    names: Vec<Arc<str>>,
    /// `(sample, index into names)`, sorted by sample, samples distinct.
    links: Vec<(u32, u32)>,
}

impl Origins {
    /// The origin of `sample`, if the slot holds it as a link.
    pub(super) fn get(&self, sample: u32) -> Option<&Arc<str>> {
        let i = self.links.binary_search_by_key(&sample, |l| l.0).ok()?;
        Some(&self.names[self.links[i].1 as usize])
    }

    /// Whether the slot holds no links.
    pub(super) fn is_empty(&self) -> bool {
        self.links.is_empty()
    }

    /// Every link, by sample: the same origin is always the same `Arc`.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u32, &Arc<str>)> {
        self.links
            .iter()
            .map(|&(s, n)| (s, &self.names[n as usize]))
    }

    /// Adds links; a sample already recorded (or given twice) takes the origin given last, as
    /// a map's insert would.
    pub(super) fn extend(&mut self, links: impl IntoIterator<Item = (u32, Arc<str>)>) {
        let before = self.links.len();
        for (sample, origin) in links {
            let n = match self.names.iter().position(|x| **x == *origin) {
                Some(n) => n,
                None => {
                    self.names.push(origin);
                    self.names.len() - 1
                }
            };
            self.links.push((sample, n as u32));
        }
        if self.links.len() == before {
            return;
        }
        // Stable: of one sample's pairs, the last added stays last, and is the one kept, in
        // place (a second vector of every link would raise the daemon's peak for nothing).
        self.links.sort_by_key(|l| l.0);
        self.links.dedup_by(|later, kept| {
            let same = later.0 == kept.0;
            if same {
                *kept = *later;
            }
            same
        });
        self.links.shrink_to_fit();
    }
}

impl FromIterator<(u32, Arc<str>)> for Origins {
    fn from_iter<I: IntoIterator<Item = (u32, Arc<str>)>>(links: I) -> Self {
        let mut o = Origins::default();
        o.extend(links);
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Against a map from sample to origin, fed the same links in the same order.
    #[test]
    fn behaves_as_a_map_of_samples_to_origins() {
        let names: Vec<Arc<str>> = ["a", "b", "gone"].iter().map(|&s| Arc::from(s)).collect();
        let mut o = Origins::default();
        let mut m: HashMap<u32, Arc<str>> = HashMap::new();
        assert!(o.is_empty());
        let mut x = 7u32;
        for round in 0..5 {
            let batch: Vec<(u32, Arc<str>)> = (0..300)
                .map(|_| {
                    x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                    // Equal names by value, not by pointer: the record interns them.
                    let name = Arc::from(&*names[(x >> 16) as usize % names.len()]);
                    ((x >> 8) % 500, name)
                })
                .collect();
            o.extend(batch.clone());
            m.extend(batch);
            assert_eq!(o.iter().count(), m.len(), "round {round}");
            for s in 0..520 {
                assert_eq!(
                    o.get(s).map(|a| &**a),
                    m.get(&s).map(|a| &**a),
                    "sample {s}"
                );
            }
        }
        let order: Vec<u32> = o.iter().map(|l| l.0).collect();
        assert!(
            order.windows(2).all(|w| w[0] < w[1]),
            "by sample, each once"
        );
        assert!(o.names.len() <= names.len(), "each origin's name once");
        assert!(!o.is_empty());
    }

    #[test]
    fn one_origin_is_one_arc() {
        let o: Origins = (0..10).map(|i| (i, Arc::from("b"))).collect();
        let firsts: Vec<*const str> = o.iter().map(|(_, a)| Arc::as_ptr(a)).collect();
        assert!(firsts.windows(2).all(|w| std::ptr::eq(w[0], w[1])));
    }
}
