//! The Python package against the binary: the `metfs` that the Python on `PATH` (or
//! `--python`) imports must be of the binary's version, or its client may speak to a daemon it
//! does not know. A missing package is only a warning: the binary works alone.
//!
//! The child drops the working directory that `python -c` puts first on `sys.path`, as a
//! training script run by path does not have it: a directory named `metfs` where the doctor
//! runs (the repository root holds the Rust crate of that name) is not the package.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{Check, Options, VERSION};

const NAME: &str = "python";

/// Prints one JSON object: the interpreter, and the package's version and place or why it
/// could not be imported.
const SCRIPT: &str = r#"
import json, sys
if sys.path and sys.path[0] == "":
    del sys.path[0]
out = {"python": sys.executable, "python_version": sys.version.split()[0]}
try:
    import metfs
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}"
else:
    out["version"] = getattr(metfs, "__version__", None)
    out["path"] = getattr(metfs, "__file__", None) or ", ".join(getattr(metfs, "__path__", []))
print(json.dumps(out))
"#;

/// What the child said, or why it said nothing.
#[derive(Debug)]
enum Outcome {
    /// The interpreter did not start.
    NoPython(String),
    /// It started and failed, or did not finish in time.
    Broken(String),
    /// Its answer.
    Answer(serde_json::Value),
}

pub(super) fn package(opts: &Options) -> Check {
    let python = opts.python.display().to_string();
    judge(&python, &ask(opts), VERSION)
}

fn ask(opts: &Options) -> Outcome {
    let child = Command::new(&opts.python)
        .args(["-c", SCRIPT])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => return Outcome::NoPython(e.to_string()),
    };
    let end = Instant::now() + opts.timeout;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Outcome::Broken(format!(
                    "did not answer within {} s",
                    opts.timeout.as_secs()
                ));
            }
        }
    }
    // The answer is one short line: it fits in the pipe, so the child never blocked on it.
    let mut out = String::new();
    let mut err = String::new();
    let _ = child.stdout.take().map(|mut s| s.read_to_string(&mut out));
    let _ = child.stderr.take().map(|mut s| s.read_to_string(&mut err));
    match serde_json::from_str(out.trim()) {
        Ok(v) => Outcome::Answer(v),
        Err(_) => Outcome::Broken(
            err.lines()
                .last()
                .unwrap_or("no answer on its standard output")
                .to_string(),
        ),
    }
}

/// A version as PEP 440 spells it, so that Cargo's `0.2.0-rc.1` equals the wheel's `0.2.0rc1`:
/// lower case, no `v`, trailing `.0`s of the release dropped, `alpha`/`beta`/`pre`/`preview`
/// as `a`/`b`/`rc`, and no separators in the pre-release.
pub(super) fn normalize(v: &str) -> String {
    let v = v.trim().to_ascii_lowercase();
    let v = v.strip_prefix('v').unwrap_or(&v);
    let split = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(v.len());
    let (release, rest) = v.split_at(split);
    let mut parts: Vec<&str> = release.trim_end_matches('.').split('.').collect();
    while parts.len() > 1 && parts.last().is_some_and(|p| p.parse() == Ok(0u64)) {
        parts.pop();
    }
    let rest = rest
        .replace("alpha", "a")
        .replace("beta", "b")
        .replace("preview", "rc")
        .replace("pre", "rc")
        .replace(['-', '_', '.'], "");
    format!("{}{rest}", parts.join("."))
}

/// Whether a Cargo version and a Python one are the same release.
pub(super) fn same_version(cargo: &str, python: &str) -> bool {
    normalize(cargo) == normalize(python)
}

fn install_fix(binary: &str) -> String {
    format!(
        "pip install the metfs wheel of version {binary} (pip install metfs=={binary}, or the \
         wheel scripts/wheel.sh builds)"
    )
}

fn judge(python: &str, outcome: &Outcome, binary: &str) -> Check {
    let answer = match outcome {
        Outcome::NoPython(e) => {
            return Check::warn(
                NAME,
                format!("{python} does not run ({e}); the package was not checked"),
                "--python PATH: the Python the training jobs use",
            )
        }
        Outcome::Broken(e) => {
            return Check::warn(
                NAME,
                format!("{python} could not be asked for the package: {e}"),
                "--python PATH: the Python the training jobs use",
            )
        }
        Outcome::Answer(v) => v,
    };
    let s = |k: &str| answer.get(k).and_then(|v| v.as_str()).unwrap_or("");
    let who = format!("{} (Python {})", s("python"), s("python_version"));
    if let Some(err) = answer.get("error").and_then(|v| v.as_str()) {
        let found = if err.starts_with("ModuleNotFoundError") {
            format!("the metfs package is not installed for {who}; the binary works alone")
        } else {
            format!("{who} fails to import metfs: {err}")
        };
        return Check::warn(NAME, found, install_fix(binary));
    }
    let at = s("path");
    match answer.get("version").and_then(|v| v.as_str()) {
        None | Some("0+unknown") => Check::warn(
            NAME,
            format!("{who} imports a metfs without a version from {at} (not the package?)"),
            install_fix(binary),
        ),
        Some(v) if same_version(binary, v) => Check::ok(
            NAME,
            format!("metfs {v} for {who} at {at}, the binary's version"),
        ),
        Some(v) => Check::fail(
            NAME,
            format!("{who} imports metfs {v} from {at}; the binary is {binary}"),
            format!(
                "{}; or run the metfs binary of version {v}",
                install_fix(binary)
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Status;

    #[test]
    fn cargo_and_python_spellings_of_one_version_are_equal() {
        assert!(same_version("0.1.0", "0.1.0"));
        assert!(same_version("0.1.0", "0.1"));
        assert!(same_version("1.2.0-rc.1", "1.2.0rc1"));
        assert!(same_version("1.2.0-alpha.2", "1.2a2"));
        assert!(same_version("1.2.0-beta1", "1.2.0b1"));
        assert!(same_version("v0.3.0", "0.3.0"));
        assert!(!same_version("0.1.0", "0.2.0"));
        assert!(!same_version("0.1.0", "0.1.0rc1"));
        assert!(!same_version("0.10.0", "0.1.0"));
        assert!(!same_version("1.0.0", "0.0.0"));
    }

    #[test]
    fn a_missing_package_warns_and_another_version_fails() {
        let answer = |v: serde_json::Value| Outcome::Answer(v);
        let base = serde_json::json!({"python": "/usr/bin/python3", "python_version": "3.11.2"});
        let mut missing = base.clone();
        missing["error"] = "ModuleNotFoundError: No module named 'metfs'".into();
        let c = judge("python3", &answer(missing), "0.1.0");
        assert_eq!(c.status, Status::Warn);
        assert!(c.found.contains("not installed") && c.fix.unwrap().contains("0.1.0"));
        let mut other = base.clone();
        other["version"] = "0.0.9".into();
        other["path"] = "/x/metfs/__init__.py".into();
        let c = judge("python3", &answer(other), "0.1.0");
        assert_eq!(c.status, Status::Fail);
        assert!(
            c.found.contains("metfs 0.0.9") && c.found.contains("binary is 0.1.0"),
            "{c:?}"
        );
        let mut same = base.clone();
        same["version"] = "0.1.0".into();
        assert_eq!(judge("python3", &answer(same), "0.1.0").status, Status::Ok);
        // A namespace package (a directory named metfs) has no version.
        let mut ns = base;
        ns["version"] = serde_json::Value::Null;
        assert_eq!(judge("python3", &answer(ns), "0.1.0").status, Status::Warn);
        let c = judge(
            "python9",
            &Outcome::NoPython("No such file".into()),
            "0.1.0",
        );
        assert_eq!(c.status, Status::Warn);
    }
}
