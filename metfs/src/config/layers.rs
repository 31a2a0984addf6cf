//! The three layers of a mount's settings, file < environment < flags, merged with `figment`.
//!
//! Each layer is kept as its own dictionary in the shape of [`MountSettings`] (the policy's
//! top-level keys moved into its internal table), so that [`Layers::origin`] can say which
//! layer a setting's value came from, and errors name it. A layer holds only what it was
//! given: the flags layer keeps only the flags clap saw on the command line (its defaults are
//! [`MountSettings::default`], below every layer), and the environment layer only `METFS_*`
//! variables that name a setting, so that `METFS_BIN` for a test or `METFS_MOUNTPOINT` for the
//! Slurm helper do not trip the unknown-key check (a setting's variable is `METFS_` and its flag
//! in capitals, `--stager-concurrency` is `METFS_STAGER_CONCURRENCY`; `socket` has none, see
//! [`env_var`]).
//!
//! Environment values are strings; they are read as the setting's type (`figment`'s lossy
//! extraction: "4" for a number, "false" for a bool), as a command line would be.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};

use super::settings::{policy_ids, setting_args, MountSettings, POLICY_TABLE};
use super::ConfigError;

/// Where a setting's value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Nothing set it.
    Default,
    /// The config file (its path).
    File(String),
    /// An environment variable (its name).
    Env(String),
    /// A flag (its name, `--budget`).
    Flag(String),
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Default => f.write_str("the default"),
            Origin::File(p) => write!(f, "config file {p}"),
            Origin::Env(v) => write!(f, "environment variable {v}"),
            Origin::Flag(flag) => write!(f, "flag {flag}"),
        }
    }
}

/// The file, environment and flag layers of one mount's settings.
#[derive(Debug, Clone, Default)]
pub struct Layers {
    /// The config file: its name and its keys.
    file: Option<(String, Dict)>,
    /// `METFS_*` variables naming a setting, and the variable of each key path.
    env: Dict,
    env_names: BTreeMap<String, String>,
    /// Flags given on the command line, and the flag of each key path.
    flags: Dict,
    flag_names: BTreeMap<String, String>,
}

/// One layer as a `figment` provider.
struct Layer<'a>(&'a Dict);

impl Provider for Layer<'_> {
    fn metadata(&self) -> Metadata {
        Metadata::named("metfs settings")
    }
    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        Ok(Profile::Default.collect(self.0.clone()))
    }
}

/// A key's path inside [`MountSettings`]: the policy's top-level keys live in its table.
fn internal(key: &str) -> String {
    if is_policy_key(key) {
        format!("{POLICY_TABLE}.{key}")
    } else {
        key.to_string()
    }
}

/// Whether a top-level key (or a path under it) is one of the policy's.
pub(super) fn is_policy_key(key: &str) -> bool {
    let first = key.split('.').next().unwrap_or(key);
    first == "kind" || policy_ids().iter().any(|p| p == first)
}

/// The key a user writes for a path inside [`MountSettings`].
fn external(path: &str) -> String {
    path.strip_prefix(POLICY_TABLE)
        .and_then(|p| p.strip_prefix('.'))
        .unwrap_or(path)
        .to_string()
}

fn insert(dict: &mut Dict, path: &str, value: Value) {
    match path.split_once('.') {
        None => {
            dict.insert(path.to_string(), value);
        }
        Some((head, rest)) => {
            let entry = dict
                .entry(head.to_string())
                .or_insert_with(|| Value::from(Dict::new()));
            if entry.as_dict().is_none() {
                *entry = Value::from(Dict::new());
            }
            if let Value::Dict(_, d) = entry {
                insert(d, rest, value);
            }
        }
    }
}

fn find<'a>(dict: &'a Dict, path: &str) -> Option<&'a Value> {
    match path.split_once('.') {
        None => dict.get(path),
        Some((head, rest)) => find(dict.get(head)?.as_dict()?, rest),
    }
}

fn one_of<S: AsRef<str>>(names: &[S]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("`{}`", n.as_ref())).collect();
    match quoted.len() {
        0 => "none".into(),
        1 => quoted[0].clone(),
        _ => format!("one of {}", quoted.join(", ")),
    }
}

/// The top-level keys a file may have, in declaration order (tables once), and aliases.
fn top_level_keys() -> Vec<String> {
    let mut seen = BTreeSet::new();
    let mut keys = Vec::new();
    for a in setting_args() {
        let id = a.get_id().to_string();
        let first = id.split('.').next().unwrap_or(&id).to_string();
        if seen.insert(first.clone()) {
            keys.push(first);
        }
    }
    keys.push("kind".into());
    keys
}

/// Settings the environment does not set. `METFS_SOCKET` tells clients (`metfs status`, the
/// Python package) which daemon to talk to; were it also a mount's socket, a second mount from
/// a shell that exported it for the first would take over the first daemon's socket.
const NOT_FROM_ENV: [&str; 1] = ["socket"];

/// The environment variable of a setting (`METFS_` and its flag in capitals), if it has one.
pub fn env_var(arg: &clap::Arg) -> Option<String> {
    if NOT_FROM_ENV.contains(&arg.get_id().as_str()) {
        return None;
    }
    let flag = arg.get_long()?;
    Some(format!("METFS_{}", flag.replace('-', "_")).to_uppercase())
}

impl Layers {
    /// No layer: every setting at its default.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the config file at `path`.
    pub fn file(self, path: &std::path::Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        self.toml(&text, &path.display().to_string())
    }

    /// Adds the text of a config file; `origin` names it in errors.
    pub fn toml(mut self, text: &str, origin: &str) -> Result<Self, ConfigError> {
        let table: toml::Table = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: origin.to_string(),
            message: e.to_string(),
        })?;
        let known = top_level_keys();
        let mut dict = Dict::new();
        for (key, value) in table {
            if !known.contains(&key) {
                return Err(ConfigError::Unknown {
                    key,
                    within: String::new(),
                    origin: Origin::File(origin.to_string()),
                    expected: one_of(&known),
                });
            }
            let value = Value::serialize(&value).map_err(|e| ConfigError::Parse {
                path: origin.to_string(),
                message: format!("`{key}`: {e}"),
            })?;
            insert(&mut dict, &internal(&key), value);
        }
        self.file = Some((origin.to_string(), dict));
        Ok(self)
    }

    /// Adds the environment: the `METFS_*` variables among `vars` that name a setting.
    pub fn env(mut self, vars: impl IntoIterator<Item = (String, String)>) -> Self {
        let names: BTreeMap<String, String> = setting_args()
            .iter()
            .filter_map(|a| Some((env_var(a)?, a.get_id().to_string())))
            .collect();
        for (var, value) in vars {
            if let Some(id) = names.get(&var) {
                let path = internal(id);
                insert(&mut self.env, &path, Value::from(value));
                self.env_names.insert(path, var);
            }
        }
        self
    }

    /// Adds the flags: of `parsed` (the command line clap parsed), the settings for which
    /// `given(id)` says the command line had the flag.
    pub fn flags(
        mut self,
        parsed: &MountSettings,
        given: impl Fn(&str) -> bool,
    ) -> Result<Self, ConfigError> {
        let all = Value::serialize(parsed).map_err(|e| ConfigError::Parse {
            path: "the command line".into(),
            message: e.to_string(),
        })?;
        let all = all.as_dict().cloned().unwrap_or_default();
        for a in setting_args() {
            let id = a.get_id().as_str();
            if !given(id) {
                continue;
            }
            let path = internal(id);
            if let Some(v) = find(&all, &path) {
                insert(&mut self.flags, &path, v.clone());
                let flag = a
                    .get_long()
                    .map_or_else(|| id.to_string(), |l| format!("--{l}"));
                self.flag_names.insert(path, flag);
            }
        }
        Ok(self)
    }

    /// Where the value of `key` (as written in a file, `stager.concurrency` for a table's)
    /// comes from: the highest layer that sets it.
    pub fn origin(&self, key: &str) -> Origin {
        let path = internal(key);
        if find(&self.flags, &path).is_some() {
            return Origin::Flag(self.flag_names.get(&path).cloned().unwrap_or_default());
        }
        if find(&self.env, &path).is_some() {
            return Origin::Env(self.env_names.get(&path).cloned().unwrap_or_default());
        }
        match &self.file {
            Some((name, d)) if find(d, &path).is_some() => Origin::File(name.clone()),
            _ => Origin::Default,
        }
    }

    /// Whether some layer sets `key`.
    pub fn given(&self, key: &str) -> bool {
        self.origin(key) != Origin::Default
    }

    /// The merged settings: defaults, then the file, the environment and the flags.
    pub fn settings(&self) -> Result<MountSettings, ConfigError> {
        let empty = Dict::new();
        let file = self.file.as_ref().map_or(&empty, |(_, d)| d);
        let figment = Figment::new()
            .merge(Layer(file))
            .merge(Layer(&self.env))
            .merge(Layer(&self.flags));
        figment.extract_lossy().map_err(|e| self.error(e))
    }

    fn error(&self, e: figment::Error) -> ConfigError {
        let path = e.path.join(".");
        match &e.kind {
            figment::error::Kind::UnknownField(name, expected) => {
                // The error's path ends with the unknown key itself.
                let full = path.clone();
                let table = external(
                    path.strip_suffix(name.as_str())
                        .unwrap_or(&path)
                        .trim_end_matches('.'),
                );
                ConfigError::Unknown {
                    key: name.clone(),
                    within: if table.is_empty() {
                        String::new()
                    } else {
                        format!("[{table}]: ")
                    },
                    origin: self.origin(&external(&full)),
                    expected: one_of(expected),
                }
            }
            kind => {
                let key = external(&path);
                ConfigError::Invalid {
                    origin: self.origin(&key),
                    key,
                    message: kind.to_string(),
                }
            }
        }
    }
}
