//! Which files of a listing are samples, which travel together, and which every view shows:
//! the user's settings (`--include`, `--exclude`, `--always`, `--group-by`) applied to a
//! listing's names.
//!
//! * [`Patterns`]: shell globs over a file's path relative to the dataset's root. A pattern
//!   without a `/` matches the file's name in any directory (`*.json`, `.DS_Store`), as
//!   `.gitignore` does; one with a `/` matches the whole path (`images/*.png`, `**/README*`).
//!   `*` and `?` never cross a `/`; `**` as a whole component crosses any number of them.
//! * [`GroupBy`]: how files make one sample.
//!   * `stem`: the files of one directory whose names agree up to their first `.` (`7.png`,
//!     `7.json`, `7.cls`) are one sample, as WebDataset groups a tar's members;
//!   * a template, `images/{}.png,masks/{}.png`: parallel trees, each part a path with one
//!     `{}` standing for the sample's key (which may hold `/`). The files of one key make one
//!     sample, and a sample is *complete* only when every part's file is there: an image
//!     without its mask is reported with the missing file named and left out whole. A file that
//!     no part matches is a sample of its own.
//!
//! Grouping is a function of the names alone, so every node groups the same listing the same
//! way, and the groups come out in the order of their first file in the listing.

use std::collections::BTreeMap;

/// A setting that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SelectError {
    /// A glob that does not parse.
    #[error("{setting} '{pattern}': not a glob: {message}")]
    Glob {
        setting: String,
        pattern: String,
        message: String,
    },
    /// A `--group-by` that is neither `stem` nor a template of two parts or more.
    #[error("group_by '{value}': {message} (write `stem`, or a template such as `images/{{}}.png,masks/{{}}.png`)")]
    GroupBy { value: String, message: String },
}

/// Globs over relative paths (see the module docs), with the setting they came from.
#[derive(Clone, Debug, Default)]
pub struct Patterns {
    patterns: Vec<(String, glob::Pattern)>,
}

const OPTIONS: glob::MatchOptions = glob::MatchOptions {
    case_sensitive: true,
    require_literal_separator: true,
    require_literal_leading_dot: false,
};

impl Patterns {
    /// Parses `patterns`; an error names `setting` and the pattern.
    pub fn new<S: AsRef<str>>(setting: &str, patterns: &[S]) -> Result<Self, SelectError> {
        let mut out = Vec::new();
        for p in patterns {
            let p = p.as_ref();
            let g = glob::Pattern::new(p).map_err(|e| SelectError::Glob {
                setting: setting.into(),
                pattern: p.into(),
                message: e.msg.into(),
            })?;
            out.push((p.to_string(), g));
        }
        Ok(Self { patterns: out })
    }

    /// Whether there is no pattern.
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// The patterns as given.
    pub fn sources(&self) -> impl Iterator<Item = &str> {
        self.patterns.iter().map(|(s, _)| s.as_str())
    }

    /// The first pattern that matches `path`, by its position.
    pub fn matching(&self, path: &str) -> Option<usize> {
        let name = path.rsplit('/').next().unwrap_or(path);
        self.patterns.iter().position(|(src, g)| {
            if src.contains('/') {
                g.matches_with(path, OPTIONS)
            } else {
                g.matches_with(name, OPTIONS)
            }
        })
    }

    /// Whether any pattern matches `path`.
    pub fn matches(&self, path: &str) -> bool {
        self.matching(path).is_some()
    }

    /// The patterns that match none of `paths`, as given (a typo the user should hear of).
    pub fn unmatched<S: AsRef<str>>(&self, paths: &[S]) -> Vec<String> {
        let mut hit = vec![false; self.patterns.len()];
        for p in paths {
            let p = p.as_ref();
            let name = p.rsplit('/').next().unwrap_or(p);
            for (i, (src, g)) in self.patterns.iter().enumerate() {
                if !hit[i] {
                    let s = if src.contains('/') { p } else { name };
                    hit[i] = g.matches_with(s, OPTIONS);
                }
            }
        }
        self.patterns
            .iter()
            .zip(hit)
            .filter(|(_, h)| !h)
            .map(|((s, _), _)| s.clone())
            .collect()
    }
}

/// How files make one sample (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GroupBy {
    /// The files of one directory with one stem.
    Stem,
    /// Parallel trees: each part's `(before, after)` the `{}`.
    Template(Vec<(String, String)>),
}

impl GroupBy {
    /// Parses `stem` or a template of two parts or more, comma-separated.
    pub fn parse(value: &str) -> Result<Self, SelectError> {
        let bad = |message: &str| SelectError::GroupBy {
            value: value.into(),
            message: message.into(),
        };
        if value.trim() == "stem" {
            return Ok(GroupBy::Stem);
        }
        let mut parts = Vec::new();
        for part in value.split(',').map(str::trim) {
            let Some((before, after)) = part.split_once("{}") else {
                return Err(bad(&format!("the part '{part}' has no {{}}")));
            };
            if after.contains("{}") {
                return Err(bad(&format!("the part '{part}' has more than one {{}}")));
            }
            if before.starts_with('/') || part.split('/').any(|c| c == "..") {
                return Err(bad(&format!(
                    "the part '{part}' is not a path inside the dataset"
                )));
            }
            parts.push((before.to_string(), after.to_string()));
        }
        if parts.len() < 2 {
            return Err(bad("a template needs two parts or more"));
        }
        if parts
            .iter()
            .enumerate()
            .any(|(i, p)| parts[..i].contains(p))
        {
            return Err(bad("two parts are the same"));
        }
        Ok(GroupBy::Template(parts))
    }

    /// The groups of `paths` (relative, any order), as positions in `paths`: every position is
    /// in exactly one group or in one incomplete group. Groups are ordered by their first file's
    /// position; a template group's files in the template's order.
    pub fn group<S: AsRef<str>>(&self, paths: &[S]) -> Grouping {
        match self {
            GroupBy::Stem => group_by_stem(paths),
            GroupBy::Template(parts) => group_by_template(parts, paths),
        }
    }
}

impl std::fmt::Display for GroupBy {
    /// As the setting is written (`stem`, `images/{}.png,masks/{}.png`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GroupBy::Stem => f.write_str("stem"),
            GroupBy::Template(parts) => {
                let parts: Vec<String> = parts.iter().map(|(b, a)| format!("{b}{{}}{a}")).collect();
                f.write_str(&parts.join(","))
            }
        }
    }
}

/// What grouping made of a listing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Grouping {
    /// Complete groups, each a list of positions in the listing.
    pub groups: Vec<Vec<usize>>,
    /// Groups with files missing: the positions present, and the paths of the missing ones.
    pub incomplete: Vec<(Vec<usize>, Vec<String>)>,
}

fn group_by_stem<S: AsRef<str>>(paths: &[S]) -> Grouping {
    let mut by_key: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (i, p) in paths.iter().enumerate() {
        let p = p.as_ref();
        let (dir, name) = p.rsplit_once('/').unwrap_or(("", p));
        // A leading dot is part of the name (`.hidden.txt` has the stem `.hidden`).
        let cut = name[1.min(name.len())..]
            .find('.')
            .map_or(name.len(), |j| j + 1);
        let key = (dir, &name[..cut]);
        match by_key.get(&key) {
            Some(&g) => groups[g].push(i),
            None => {
                by_key.insert(key, groups.len());
                groups.push(vec![i]);
            }
        }
    }
    Grouping {
        groups,
        incomplete: Vec::new(),
    }
}

fn group_by_template<S: AsRef<str>>(parts: &[(String, String)], paths: &[S]) -> Grouping {
    // Key → (first position seen, the position of each part's file).
    let mut keys: BTreeMap<&str, (usize, Vec<Option<usize>>)> = BTreeMap::new();
    let mut singles = Vec::new();
    for (i, p) in paths.iter().enumerate() {
        let p = p.as_ref();
        let found = parts.iter().enumerate().find_map(|(k, (before, after))| {
            let key = p
                .strip_prefix(before.as_str())?
                .strip_suffix(after.as_str())?;
            (!key.is_empty()).then_some((k, key))
        });
        match found {
            Some((k, key)) => {
                let e = keys
                    .entry(key)
                    .or_insert_with(|| (i, vec![None; parts.len()]));
                e.1[k] = Some(i);
            }
            None => singles.push(i),
        }
    }
    let mut out: Vec<(usize, Vec<usize>, Vec<String>)> = Vec::new();
    for (key, (first, at)) in keys {
        let present: Vec<usize> = at.iter().flatten().copied().collect();
        let missing: Vec<String> = at
            .iter()
            .zip(parts)
            .filter(|(a, _)| a.is_none())
            .map(|(_, (before, after))| format!("{before}{key}{after}"))
            .collect();
        out.push((first, present, missing));
    }
    out.extend(singles.into_iter().map(|i| (i, vec![i], Vec::new())));
    out.sort_unstable_by_key(|(first, _, _)| *first);
    let mut g = Grouping::default();
    for (_, present, missing) in out {
        if missing.is_empty() {
            g.groups.push(present);
        } else {
            g.incomplete.push((present, missing));
        }
    }
    g
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_names_or_paths() {
        let p = Patterns::new("exclude", &["*.json", "images/*.png", "**/README*"]).unwrap();
        assert!(p.matches("a/b/x.json"));
        assert!(p.matches("images/1.png"));
        assert!(!p.matches("images/a/1.png"));
        assert!(p.matches("docs/deep/README.md"));
        assert!(p.matches("README"));
        assert!(!p.matches("x.png"));
        assert_eq!(p.unmatched(&["x.json"]), vec!["images/*.png", "**/README*"]);
    }

    #[test]
    fn a_bad_glob_names_setting_and_pattern() {
        let e = Patterns::new("include", &["[a-"]).unwrap_err();
        assert!(
            e.to_string().starts_with("include '[a-': not a glob"),
            "{e}"
        );
    }

    #[test]
    fn group_by_parses() {
        assert_eq!(GroupBy::parse("stem").unwrap(), GroupBy::Stem);
        let t = GroupBy::parse("images/{}.png, masks/{}.png").unwrap();
        assert_eq!(t.to_string(), "images/{}.png,masks/{}.png");
        assert_eq!(
            t,
            GroupBy::Template(vec![
                ("images/".into(), ".png".into()),
                ("masks/".into(), ".png".into())
            ])
        );
        for bad in [
            "images/{}.png",
            "a/{}.png,b.png",
            "a/{}{}.png,b/{}",
            "/a/{},b/{}",
            "a/{},a/{}",
        ] {
            let e = GroupBy::parse(bad).unwrap_err();
            assert!(e.to_string().starts_with("group_by '"), "{e}");
        }
    }

    #[test]
    fn stem_groups_within_a_directory() {
        let files = ["a/1.png", "a/1.json", "a/2.png", "b/1.png", ".x.a", ".x.b"];
        let g = GroupBy::Stem.group(&files);
        assert_eq!(g.groups, vec![vec![0, 1], vec![2], vec![3], vec![4, 5]]);
        assert!(g.incomplete.is_empty());
    }

    #[test]
    fn template_pairs_trees_and_reports_the_missing() {
        let files = [
            "classes.txt",
            "images/1.png",
            "images/2.png",
            "images/sub/3.png",
            "masks/1.png",
            "masks/3.png",
            "masks/sub/3.png",
        ];
        let t = GroupBy::parse("images/{}.png,masks/{}.png").unwrap();
        let g = t.group(&files);
        assert_eq!(g.groups, vec![vec![0], vec![1, 4], vec![3, 6]]);
        assert_eq!(
            g.incomplete,
            vec![
                (vec![2], vec!["masks/2.png".to_string()]),
                (vec![5], vec!["images/3.png".to_string()]),
            ]
        );
    }

    proptest::proptest! {
        /// Every file is in exactly one group, complete or not.
        #[test]
        fn every_file_in_one_group(names in proptest::collection::btree_set("[ab]/[0-3]\\.(png|json)|(images|masks)/[0-4]\\.png|x[0-2]", 0..40), stem in proptest::bool::ANY) {
            let files: Vec<String> = names.into_iter().collect();
            let rule = if stem { GroupBy::Stem } else { GroupBy::parse("images/{}.png,masks/{}.png").unwrap() };
            let g = rule.group(&files);
            let mut seen = vec![0u32; files.len()];
            for grp in g.groups.iter().chain(g.incomplete.iter().map(|(p, _)| p)) {
                proptest::prop_assert!(!grp.is_empty() || !stem);
                for &i in grp { seen[i] += 1; }
            }
            proptest::prop_assert!(seen.iter().all(|&n| n == 1));
        }
    }
}
