//! The settings reference, generated from [`MountSettings`]: `metfs config --defaults` prints
//! every key as a commented TOML file (its help, its flag and variable, its default), from which
//! `scripts/config_doc.py` generates docs/CONFIGURATION.md. The tests here hold that page's
//! tables and its sample config file to the same declaration.

use std::fmt::Write;

use figment::value::{Dict, Value};

use super::layers::env_var;
use super::settings::{setting_args, MountSettings, REQUIRED};
use super::{ConfigError, Layers, Origin};

/// The default a setting's flag shows: its clap default, else the `[default: ...]` its help
/// names (a derived default), else `(required)` for the settings a mount cannot do without.
pub fn shown_default(arg: &clap::Arg) -> Option<String> {
    let values: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    if !values.is_empty() {
        return Some(values.join(","));
    }
    let help = help_text(arg);
    if let Some(i) = help.find("[default: ") {
        let rest = &help[i + "[default: ".len()..];
        return rest.find(']').map(|j| rest[..j].to_string());
    }
    REQUIRED
        .contains(&arg.get_id().as_str())
        .then(|| "(required)".to_string())
}

fn help_text(arg: &clap::Arg) -> String {
    arg.get_long_help()
        .or(arg.get_help())
        .map(|h| h.to_string())
        .unwrap_or_default()
}

fn comment(out: &mut String, text: &str) {
    for para in text.split("\n\n") {
        let mut line = String::from("#");
        for word in para.split_whitespace() {
            if line.len() + word.len() > 95 {
                let _ = writeln!(out, "{line}");
                line = String::from("#");
            }
            line.push(' ');
            line.push_str(word);
        }
        let _ = writeln!(out, "{line}");
    }
}

fn toml_value(v: &Value) -> Option<String> {
    toml::Value::try_from(v).ok().map(|t| t.to_string())
}

fn find<'a>(dict: &'a Dict, path: &str) -> Option<&'a Value> {
    match path.split_once('.') {
        None => dict.get(path),
        Some((head, rest)) => find(dict.get(head)?.as_dict()?, rest),
    }
}

/// Every setting as a commented TOML file with its default: the output of
/// `metfs config --defaults`. Settings without a default are commented out.
pub fn defaults_toml() -> String {
    let mut out = String::new();
    comment(
        &mut out,
        "metfs mount settings, each with its default (`metfs config --defaults`). Give this \
         file with `metfs mount --config FILE`; an environment variable METFS_<FLAG> overrides \
         a key of the file, and a flag overrides both. A commented key has no fixed default.",
    );
    render(&mut out, &MountSettings::default(), None);
    out
}

/// The settings `layers` give, as TOML, each with where it came from (`metfs config`).
pub fn effective_toml(layers: &Layers) -> Result<String, ConfigError> {
    let mut out = String::new();
    comment(
        &mut out,
        "The settings of a mount with this config file, environment and flags; each line says \
         where its value came from. A commented key is unset (its default is derived at mount).",
    );
    render(&mut out, &layers.settings()?, Some(layers));
    Ok(out)
}

fn render(out: &mut String, values: &MountSettings, layers: Option<&Layers>) {
    let defaults = Value::serialize(values)
        .ok()
        .and_then(|v| v.into_dict())
        .unwrap_or_default();
    let mut tables: Vec<String> = Vec::new();
    let args = setting_args();
    for a in &args {
        if let Some((t, _)) = a.get_id().as_str().split_once('.') {
            if !tables.iter().any(|x| x == t) {
                tables.push(t.to_string());
            }
        }
    }
    for table in std::iter::once(None).chain(tables.iter().map(Some)) {
        if let Some(t) = table {
            let _ = writeln!(out, "\n[{t}]");
        }
        for a in &args {
            let id = a.get_id().as_str();
            let key = match (table, id.split_once('.')) {
                (None, None) => id,
                (Some(t), Some((tt, k))) if t == tt => k,
                _ => continue,
            };
            let flag = a.get_long().unwrap_or(key);
            if layers.is_none() {
                out.push('\n');
                comment(out, &help_text(a));
                let var = env_var(a).unwrap_or_else(|| "not from the environment".into());
                comment(out, &format!("--{flag}, {var}"));
            }
            let path = if table.is_none() && super::layers::is_policy_key(id) {
                format!("{}.{id}", super::settings::POLICY_TABLE)
            } else {
                id.to_string()
            };
            let origin = match layers.map(|l| l.origin(id)) {
                None | Some(Origin::Default) => String::new(),
                Some(o) => format!("  # {o}"),
            };
            match find(&defaults, &path).and_then(toml_value) {
                Some(v) => {
                    let _ = writeln!(out, "{key} = {v}{origin}");
                }
                None => {
                    let _ = writeln!(out, "# {key} =");
                }
            }
        }
        if layers.is_none() && table.map(String::as_str) == Some("s3") {
            // The keys of `[s3]` that have no flag (credentials never belong on a command
            // line): documented in docs/S3.md and on `metfs_tier::s3::S3Config`.
            out.push('\n');
            comment(
                out,
                "Keys of [s3] without a flag, at their defaults (docs/S3.md): access_key_id, \
                 secret_access_key and session_token (prefer the AWS_* environment), request \
                 sizes, parallelism, timeouts and retries.",
            );
            let _ = writeln!(out, "# access_key_id =");
            let _ = writeln!(out, "# secret_access_key =");
            let _ = writeln!(out, "# session_token =");
            let s3 = find(&defaults, "s3").and_then(Value::as_dict);
            let flagged: Vec<&str> = args
                .iter()
                .filter_map(|a| a.get_id().as_str().strip_prefix("s3."))
                .collect();
            let mut sub = String::new();
            for (k, v) in s3.into_iter().flatten() {
                if flagged.contains(&k.as_str()) || k == "access_key_id" {
                    continue;
                }
                match v.as_dict() {
                    Some(d) => {
                        let _ = writeln!(sub, "\n[s3.{k}]");
                        for (kk, vv) in d {
                            if let Some(t) = toml_value(vv) {
                                let _ = writeln!(sub, "{kk} = {t}");
                            }
                        }
                    }
                    None => {
                        if let Some(t) = toml_value(v) {
                            let _ = writeln!(out, "{k} = {t}");
                        }
                    }
                }
            }
            out.push_str(&sub);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::MountConfig;

    const CONFIGURATION: &str = include_str!("../../../docs/CONFIGURATION.md");

    /// The key (`table.key` in a table) of every row with a flag in docs/CONFIGURATION.md,
    /// the page `scripts/config_doc.py` generates from [`defaults_toml`] (tests/test_docs.py
    /// holds the page to that output, defaults and help included).
    fn documented_keys() -> Vec<String> {
        let mut table: Option<String> = None;
        let mut out = Vec::new();
        for line in CONFIGURATION.lines() {
            if let Some(heading) = line.strip_prefix("## ") {
                table = match heading {
                    "Top-level keys" => Some(String::new()),
                    h => h
                        .strip_prefix("`[")
                        .and_then(|r| r.strip_suffix("]`"))
                        .map(str::to_string),
                };
                continue;
            }
            let Some(t) = &table else { continue };
            let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
            // Rows of keys start with the key in code; the keys without a flag (some of
            // `[s3]`) are a table of two columns.
            if !line.starts_with("| `") || cells.len() < 5 {
                continue;
            }
            let key = cells[0].trim_matches('`');
            out.push(if t.is_empty() {
                key.to_string()
            } else {
                format!("{t}.{key}")
            });
        }
        out
    }

    #[test]
    fn configuration_page_lists_every_setting() {
        let documented = documented_keys();
        let ids: Vec<String> = setting_args()
            .iter()
            .map(|a| a.get_id().to_string())
            .collect();
        let mut problems = Vec::new();
        for id in &ids {
            if !documented.contains(id) {
                problems.push(format!(
                    "`{id}` is missing from docs/CONFIGURATION.md (run `python3 scripts/config_doc.py`)"
                ));
            }
        }
        for k in &documented {
            if !ids.contains(k) {
                problems.push(format!(
                    "docs/CONFIGURATION.md lists `{k}`, which is no setting"
                ));
            }
        }
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }

    #[test]
    fn every_setting_shows_a_default_and_a_help() {
        for a in setting_args() {
            assert!(
                shown_default(&a).is_some(),
                "{}: no default shown",
                a.get_id()
            );
            assert!(!help_text(&a).is_empty(), "{}: no help", a.get_id());
        }
    }

    #[test]
    fn printed_defaults_parse_back_to_the_defaults() {
        let text = defaults_toml();
        let got = Layers::new()
            .toml(&text, "defaults")
            .unwrap()
            .settings()
            .unwrap();
        assert_eq!(got, MountSettings::default());
        for a in setting_args() {
            let id = a.get_id().as_str();
            let key = id.rsplit('.').next().unwrap();
            assert!(
                text.lines()
                    .any(|l| l.starts_with(&format!("{key} =")) || l == format!("# {key} =")),
                "{id} is not in the printed defaults:\n{text}"
            );
        }
    }

    #[test]
    fn sections_default_to_their_own_defaults() {
        let d = MountSettings::default();
        assert_eq!(d.policy, metfs_feedback::config::PolicyConfig::default());
        assert_eq!(d.stager, metfs_prefetcher::stager::StagerConfig::default());
        assert_eq!(d.control, crate::config::ControlConfig::default());
        assert_eq!(d.s3, metfs_tier::s3::S3Config::default());
    }

    #[test]
    fn configuration_sample_config_resolves() {
        let mut blocks = CONFIGURATION.split("```toml\n").skip(1);
        let block = blocks
            .next()
            .expect("docs/CONFIGURATION.md has a ```toml block");
        let text = block.split("```").next().unwrap();
        let cfg = MountConfig::from_toml(text, "docs/CONFIGURATION.md").unwrap();
        assert!(cfg.budget > 0);
    }
}
