//! Shards without a dataset index (WebDataset, TFRecord): a shard and its index file are one
//! group.
//!
//! WebDataset and TFRecord loaders take a list of shard files, so a view needs no rewritten
//! index: it needs each shard to travel with its own index file (DALI's `wds2idx` and
//! `tfrecord2idx`, the `tfrecord` package's `create_index`), which a loader reads to seek. The
//! rule is data ([`Rule`], [`RULES`]), so the planner can group a catalog with it:
//!
//! * a *shard* is a file whose name ends in one of the rule's shard suffixes (the longest that
//!   matches gives its stem: `a/x.tar.gz` has the stem `a/x`);
//! * its *companions* are the files named the shard plus a companion suffix (`a/x.tar.idx`) or
//!   its stem plus one (`a/x.idx`), in the rule's order; a companion two shards could claim
//!   (`x.idx` beside `x.tar` and `x.tgz`) goes to the first by name;
//! * a companion without its shard is no group's: an *other* file.
//!
//! A listing is detected as the format ([`is_grouped`]) when it has at least one shard and every
//! file below the root is a shard or a companion; files at the root (a README, a class list)
//! are left as *other* files for the caller's settings. Grouping cannot fail: it has no error
//! type.

use crate::{Format, Shard};
use std::collections::BTreeSet;

/// Which files make one shard of an unindexed format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rule {
    /// The format the rule groups.
    pub format: Format,
    /// A shard's name ends in one of these.
    pub shard_suffixes: &'static [&'static str],
    /// A companion's name is its shard's name or stem followed by one of these.
    pub companion_suffixes: &'static [&'static str],
}

/// The rules, one per unindexed format.
pub const RULES: [Rule; 2] = [
    Rule {
        format: Format::WebDataset,
        shard_suffixes: &[".tar", ".tar.gz", ".tgz"],
        companion_suffixes: &[".idx", ".index"],
    },
    Rule {
        format: Format::TfRecord,
        shard_suffixes: &[".tfrecord", ".tfrecords", ".tfrec", ".tfrecord.gz"],
        companion_suffixes: &[".idx", ".index"],
    },
];

impl Rule {
    /// The rule of `format`, if it is an unindexed format.
    pub fn of(format: Format) -> Option<&'static Rule> {
        RULES.iter().find(|r| r.format == format)
    }

    /// The stem of `file` if it is a shard (the longest shard suffix that matches removed).
    pub fn stem<'a>(&self, file: &'a str) -> Option<&'a str> {
        self.shard_suffixes
            .iter()
            .filter_map(|s| file.strip_suffix(s))
            .filter(|stem| !stem.is_empty() && !stem.ends_with('/'))
            .min_by_key(|stem| stem.len())
    }

    /// The names a companion of the shard `shard` may have, in the rule's order.
    pub fn companions(&self, shard: &str) -> Vec<String> {
        let Some(stem) = self.stem(shard) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for c in self.companion_suffixes {
            out.push(format!("{shard}{c}"));
            out.push(format!("{stem}{c}"));
        }
        out
    }
}

/// The groups `rule` makes of `files`, by shard name.
pub fn group(rule: &Rule, files: &BTreeSet<&str>) -> Vec<Shard> {
    let mut claimed = BTreeSet::new();
    let mut out = Vec::new();
    for &f in files {
        if rule.stem(f).is_none() {
            continue;
        }
        let mut members = vec![f.to_string()];
        for c in rule.companions(f) {
            if files.contains(c.as_str()) && rule.stem(&c).is_none() && claimed.insert(c.clone()) {
                members.push(c);
            }
        }
        out.push(Shard {
            name: f.to_string(),
            files: members,
        });
    }
    out
}

/// Whether `files` is a dataset of `rule`'s format (see the module docs).
pub fn is_grouped(rule: &Rule, files: &BTreeSet<&str>) -> bool {
    let groups = group(rule, files);
    let covered: BTreeSet<&str> = groups
        .iter()
        .flat_map(|g| g.files.iter().map(String::as_str))
        .collect();
    !groups.is_empty()
        && files
            .iter()
            .all(|f| !f.contains('/') || covered.contains(f))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set<'a>(names: &[&'a str]) -> BTreeSet<&'a str> {
        names.iter().copied().collect()
    }

    #[test]
    fn a_tar_and_its_index_are_one_group() {
        let wds = Rule::of(Format::WebDataset).unwrap();
        let files = set(&[
            "a/0.tar",
            "a/0.idx",
            "a/1.tar",
            "a/1.tar.idx",
            "a/2.idx",
            "README.md",
        ]);
        let g = group(wds, &files);
        assert_eq!(
            g,
            [
                Shard {
                    name: "a/0.tar".into(),
                    files: vec!["a/0.tar".into(), "a/0.idx".into()]
                },
                Shard {
                    name: "a/1.tar".into(),
                    files: vec!["a/1.tar".into(), "a/1.tar.idx".into()]
                },
            ]
        );
        // `a/2.idx` has no shard: not a WebDataset listing (a stray file below the root).
        assert!(!is_grouped(wds, &files));
        assert!(is_grouped(wds, &set(&["a/0.tar", "a/0.idx", "README.md"])));
    }

    #[test]
    fn a_companion_goes_to_one_shard_and_stems_take_the_longest_suffix() {
        let wds = Rule::of(Format::WebDataset).unwrap();
        assert_eq!(wds.stem("x.tar.gz"), Some("x"));
        assert_eq!(wds.stem(".tar"), None);
        let g = group(wds, &set(&["x.tar", "x.tgz", "x.idx"]));
        assert_eq!(g[0].files, ["x.tar", "x.idx"]);
        assert_eq!(g[1].files, ["x.tgz"]);
        let tf = Rule::of(Format::TfRecord).unwrap();
        let g = group(
            tf,
            &set(&[
                "t-0.tfrecord",
                "t-0.index",
                "t-1.tfrecord.gz",
                "t-1.tfrecord.gz.idx",
            ]),
        );
        assert_eq!(g[0].files, ["t-0.tfrecord", "t-0.index"]);
        assert_eq!(g[1].files, ["t-1.tfrecord.gz", "t-1.tfrecord.gz.idx"]);
    }
}
