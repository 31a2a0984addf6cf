//! What a sample is: the settings `format`, `group_by`, `always`, `include` and `exclude`,
//! resolved once into a [`SampleConfig`] (`metfs_formats` owns their meaning; the daemon's
//! `samples` module applies them to a catalog).
//!
//! They shape the plan of a plain mount, the queue of a dynamic-sharding one (`--dds`), the
//! cohort of a shared one (`--share`, whose jobs draw samples) and the shares of an aggregate
//! one (`--aggregate`, whose exchange plans over the same groups, `CACHE/groups.bin`):
//! `metfs dds init` takes the same settings, resolved here by the same checks
//! ([`SampleConfig::from_flags`]), and the queue records them ([`SampleConfig::record`]), so a
//! mount whose samples differ from the queue's is refused naming both. A transform or HDF5
//! container mode stages other things than files: a setting here with one of those is refused
//! at mount, and with those `format = auto` detects nothing.

use std::fmt;
use std::str::FromStr;

use metfs_formats::select::{GroupBy, Patterns};
use metfs_formats::Format;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::check::Check;
use super::settings::MountSettings;
use super::{ConfigError, Layers};

/// How the dataset's format is chosen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FormatChoice {
    /// Detected from the listing (and the index files' bytes) at mount; no format found
    /// means every file is a sample.
    #[default]
    Auto,
    /// Every file is a sample; index files are dealt like any other (the behaviour before
    /// formats were known).
    Files,
    /// This format; a listing that is not one is an error naming the file it lacks.
    Is(Format),
}

impl FromStr for FormatChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "" | "auto" => Ok(FormatChoice::Auto),
            "files" | "none" => Ok(FormatChoice::Files),
            name => Format::from_name(name)
                .map(FormatChoice::Is)
                .ok_or_else(|| {
                    let names: Vec<&str> = Format::ALL.iter().map(|f| f.name()).collect();
                    format!(
                        "unknown format '{name}'; one of auto, files, {}",
                        names.join(", ")
                    )
                }),
        }
    }
}

impl fmt::Display for FormatChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FormatChoice::Auto => f.write_str("auto"),
            FormatChoice::Files => f.write_str("files"),
            FormatChoice::Is(x) => f.write_str(x.name()),
        }
    }
}

impl Serialize for FormatChoice {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for FormatChoice {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// What a sample is, resolved (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct SampleConfig {
    /// The dataset's format. Default `auto`: a Hugging Face, MDS, litdata, WebDataset or
    /// TFRecord directory is recognised and its loader reads a view unmodified; any other
    /// listing is files as before, at the cost of one pass over the names.
    pub format: FormatChoice,
    /// How files make one sample. Default none: each file is one (a format's shards group
    /// themselves).
    pub group_by: Option<GroupBy>,
    /// Files shown in every view, staged once per mount, never dealt. Default none.
    pub always: Patterns,
    /// Only files matching one of these are part of the dataset. Default none: every file.
    pub include: Patterns,
    /// Files matching one of these are not part of the dataset, even where `include` matches.
    /// Default none.
    pub exclude: Patterns,
}

impl SampleConfig {
    /// Whether the user set anything beyond the default (`format = auto` alone is not).
    pub fn is_set(&self) -> bool {
        self.format != FormatChoice::Auto
            || self.group_by.is_some()
            || !self.always.is_empty()
            || !self.include.is_empty()
            || !self.exclude.is_empty()
    }

    /// Whether the settings shape the plan beyond one sample per file: `format = files` alone
    /// does not (it is how every mode deals files, and what an aggregate or transform mount of
    /// a dataset in a format is told to give).
    fn shapes_the_plan(&self) -> bool {
        !matches!(self.format, FormatChoice::Auto | FormatChoice::Files)
            || self.group_by.is_some()
            || !self.always.is_empty()
            || !self.include.is_empty()
            || !self.exclude.is_empty()
    }

    /// Whether format detection runs at mount.
    pub fn detects(&self) -> bool {
        self.format == FormatChoice::Auto
    }

    /// The settings as one line, for the plan's fingerprint: a saved position is resumed only
    /// under the same samples. `None` at the defaults, so older saved positions still match.
    pub fn fingerprint(&self) -> Option<String> {
        if !self.is_set() {
            return None;
        }
        let list = |p: &Patterns| p.sources().collect::<Vec<_>>().join("\u{1f}");
        let group_by = self
            .group_by
            .as_ref()
            .map_or(String::new(), |g| g.to_string());
        Some(format!(
            "format={};group_by={};always={};include={};exclude={}",
            self.format,
            group_by,
            list(&self.always),
            list(&self.include),
            list(&self.exclude)
        ))
    }

    /// What a dynamic-sharding queue records of the samples it deals: the dataset's `format`
    /// (the one detected or set), `group_by` or the manifest's group column (`manifest_groups`),
    /// `always`, `include` and `exclude`, as one line a user can read in a refusal. `None`
    /// when every file of the source is a sample, which is what a queue made before sample
    /// groups means.
    pub fn record(&self, format: Option<Format>, manifest_groups: bool) -> Option<String> {
        let mut parts = Vec::new();
        if let Some(f) = format {
            parts.push(format!("format {}", f.name()));
        }
        if let Some(g) = &self.group_by {
            parts.push(format!("group_by '{g}'"));
        }
        if manifest_groups {
            parts.push("the manifest's group column".to_string());
        }
        for (key, p) in [
            ("always", &self.always),
            ("include", &self.include),
            ("exclude", &self.exclude),
        ] {
            if !p.is_empty() {
                parts.push(format!(
                    "{key} '{}'",
                    p.sources().collect::<Vec<_>>().join(",")
                ));
            }
        }
        (!parts.is_empty()).then(|| parts.join(", "))
    }

    /// The sample settings of a command other than a mount (`metfs dds init`), given as the
    /// mount's flags: `parsed` holds them (and a transform's command, refused beside them as a
    /// mount refuses it), `given(id)` says which the command line had. Resolved by the
    /// mount's own checks, so a bad value is the same error naming the same flag.
    pub fn from_flags(
        parsed: &MountSettings,
        given: impl Fn(&str) -> bool,
    ) -> Result<Self, ConfigError> {
        let layers = Layers::new().flags(parsed, given)?;
        let s = layers.settings()?;
        resolve(&s, &Check::new(&layers))
    }
}

/// The settings of `s` resolved; an error names the setting.
pub(super) fn resolve(s: &MountSettings, check: &Check) -> Result<SampleConfig, ConfigError> {
    let patterns = |key: &str, v: &Option<Vec<String>>| {
        let v: Vec<&str> = v
            .iter()
            .flatten()
            .map(|x| x.trim())
            .filter(|x| !x.is_empty())
            .collect();
        Patterns::new(key, &v).map_err(|e| check.invalid(key, e.to_string()))
    };
    let group_by = match s.group_by.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(g) => Some(GroupBy::parse(g).map_err(|e| check.invalid("group_by", e.to_string()))?),
    };
    let cfg = SampleConfig {
        format: s.format,
        group_by,
        always: patterns("always", &s.always)?,
        include: patterns("include", &s.include)?,
        exclude: patterns("exclude", &s.exclude)?,
    };
    if cfg.shapes_the_plan() {
        let other = if s.hdf5_container {
            Some("HDF5 container mode".to_string())
        } else if s.transform.command.is_some() {
            Some("a transform".to_string())
        } else {
            None
        };
        if let Some(other) = other {
            let key = cfg.first_set_key();
            return Err(check.invalid(
                key,
                format!("not with {other}: sample groups, formats and file selection shape the plan of a plain, --dds, --share or --aggregate mount only"),
            ));
        }
    }
    Ok(cfg)
}

impl SampleConfig {
    /// The first setting that is not at its default, for messages.
    fn first_set_key(&self) -> &'static str {
        if !matches!(self.format, FormatChoice::Auto | FormatChoice::Files) {
            "format"
        } else if self.group_by.is_some() {
            "group_by"
        } else if !self.always.is_empty() {
            "always"
        } else if !self.include.is_empty() {
            "include"
        } else {
            "exclude"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_choice_round_trips() {
        for s in [
            "auto",
            "files",
            "hf-dataset",
            "mds",
            "litdata",
            "webdataset",
        ] {
            assert_eq!(s.parse::<FormatChoice>().unwrap().to_string(), s);
        }
        let e = "parquet".parse::<FormatChoice>().unwrap_err();
        assert!(e.contains("unknown format 'parquet'"), "{e}");
    }

    fn mount(extra: &str) -> Result<crate::config::MountConfig, ConfigError> {
        let text = format!("source = \"/data\"\ncache = \"/cache\"\nbudget = \"1GiB\"\n{extra}");
        crate::config::MountConfig::from_toml(&text, "test.toml")
    }

    /// Dds, shared and aggregate mounts take the sample settings; a transform refuses them,
    /// naming the setting and the mode.
    #[test]
    fn dds_shared_and_aggregate_mounts_take_sample_settings_and_a_transform_refuses_them() {
        let groups = "group_by = \"images/{}.png,masks/{}.png\"\nalways = [\"classes.txt\"]\n";
        let c = mount(&format!(
            "{groups}[dds]\nurl = \"etcd://127.0.0.1:2379/q\"\n"
        ))
        .unwrap();
        assert!(c.mode.dds().is_some() && c.samples.group_by.is_some());
        // A shared mount's cohort draws the samples: every setting is taken.
        let c = mount(&format!("{groups}[share]\nenabled = true\n")).unwrap();
        assert!(c.mode.shared().is_some() && c.samples.group_by.is_some());
        let c = mount("format = \"mds\"\n[share]\nenabled = true\n").unwrap();
        assert_eq!(c.samples.format, FormatChoice::Is(Format::Mds));
        let c = mount(&format!("{groups}[aggregate]\nenabled = true\n")).unwrap();
        assert!(c.mode.aggregate().is_some() && c.samples.group_by.is_some());
        let c = mount("format = \"mds\"\n[aggregate]\nenabled = true\n").unwrap();
        assert_eq!(c.samples.format, FormatChoice::Is(Format::Mds));
        let e = mount(&format!(
            "{groups}[transform]\ncommand = \"python3 -m prep\"\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("`group_by`") && e.contains("not with a transform"),
            "{e}"
        );
    }

    /// `metfs dds init`'s flags resolve by the mount's checks: a bad value is the same error
    /// naming the flag, and a transform is refused beside them.
    #[test]
    fn from_flags_resolves_as_a_mount_does() {
        let given = |ids: &'static [&'static str]| move |id: &str| ids.contains(&id);
        let parsed = MountSettings {
            group_by: Some("images/{}.png,masks/{}.png".into()),
            exclude: Some(vec![".DS_Store".into()]),
            ..MountSettings::default()
        };
        let c = SampleConfig::from_flags(&parsed, given(&["group_by", "exclude"])).unwrap();
        assert_eq!(
            c.record(None, false).as_deref(),
            Some("group_by 'images/{}.png,masks/{}.png', exclude '.DS_Store'")
        );
        let bad = MountSettings {
            group_by: Some("images/{}.png".into()),
            ..MountSettings::default()
        };
        let e = SampleConfig::from_flags(&bad, given(&["group_by"]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--group-by") && e.contains("a template needs two parts"),
            "{e}"
        );
        let mut transformed = parsed.clone();
        transformed.transform.command = Some("prep".into());
        let e = SampleConfig::from_flags(
            &transformed,
            given(&["group_by", "exclude", "transform.command"]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("not with a transform"), "{e}");
    }

    /// The record names the samples' settings; none when every file is a sample.
    #[test]
    fn the_record_names_what_shapes_the_samples() {
        assert_eq!(SampleConfig::default().record(None, false), None);
        let files = SampleConfig {
            format: FormatChoice::Files,
            ..SampleConfig::default()
        };
        assert_eq!(files.record(None, false), None, "files are samples");
        let c = SampleConfig {
            always: Patterns::new("always", &["classes.txt", "*.json"]).unwrap(),
            ..SampleConfig::default()
        };
        assert_eq!(
            c.record(Some(Format::Mds), true).as_deref(),
            Some("format mds, the manifest's group column, always 'classes.txt,*.json'")
        );
    }
}
