//! The schema file against the types, versions refused by every reader, and round trips.

use super::event::{PassEnd, Tier};
use super::*;

/// The workspace root (this crate is `metfs/`).
fn root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("metfs/ has a parent")
        .to_path_buf()
}

/// `docs/protocol.schema.json` is what the types generate. With `METFS_WRITE_SCHEMA=1` the
/// test writes it instead (after a deliberate change of the protocol).
#[test]
fn schema_is_checked_in() {
    let path = root().join(SCHEMA_PATH);
    let mut fresh = serde_json::to_string_pretty(&schema()).unwrap();
    fresh.push('\n');
    if std::env::var_os("METFS_WRITE_SCHEMA").is_some() {
        std::fs::write(&path, &fresh).unwrap();
        return;
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == fresh,
        "{} differs from the protocol's Rust types (the metfs-protocol crate, metfs-protocol/src). If the change is \
         deliberate, regenerate it with\n  METFS_WRITE_SCHEMA=1 cargo test -p metfs-protocol --lib \
         tests::schema_is_checked_in\nand update the Python client \
         (bindings/python/src/metfs/client.py) to match.",
        path.display()
    );
}

#[test]
fn the_schema_names_every_message() {
    let s = schema();
    let defs = s["$defs"].as_object().unwrap();
    for name in [
        "RequestLine",
        "HelloReply",
        "StatusReply",
        "FilesViewReply",
        "DecisionReply",
        "ShuttingDownReply",
        "ErrorReply",
        "Record",
        "Staging",
        "Start",
        "PassEnd",
    ] {
        assert!(
            defs.contains_key(name),
            "{name} missing from {:?}",
            defs.keys()
        );
    }
}

#[test]
fn a_reply_of_another_major_version_is_refused_naming_both() {
    let e = read_reply::<FilesView>(r#"{"v":2,"ok":true,"paths":[]}"#).unwrap_err();
    assert_eq!(e.code, ErrorCode::UnsupportedVersion);
    assert!(
        e.message.contains("version 2") && e.message.contains("version 1"),
        "{}",
        e.message
    );
    // The typed reader refuses it too, when a message is read without `check_version`.
    let e = serde_json::from_str::<Record>(r#"{"v":3,"t":1.0,"event":"tier","tier_bytes_read":1}"#)
        .unwrap_err();
    assert!(e.to_string().contains("version 3"), "{e}");
}

#[test]
fn replies_read_back_and_errors_become_the_daemons() {
    let view = FilesView {
        generation: 3,
        epoch: 1,
        mini_epoch: 0,
        mountpoint: "/m".into(),
        files: vec!["a/b".into()],
        count: 1,
        unchanged: false,
        packed: None,
        direct_root: Some("/cache/slots/a".into()),
    };
    let line = serde_json::to_string(&Reply::new(view.clone())).unwrap();
    assert!(line.starts_with(r#"{"v":1,"ok":true,"#), "{line}");
    assert_eq!(read_reply::<FilesView>(&line).unwrap(), view);
    // Written before `v` (and `count`, `unchanged`, `packed`) existed: read as version 1.
    let old =
        r#"{"ok":true,"generation":3,"epoch":1,"mini_epoch":0,"mountpoint":"/m","files":["a/b"]}"#;
    assert_eq!(
        read_reply::<FilesView>(old).unwrap(),
        FilesView {
            count: 0,
            direct_root: None,
            ..view
        }
    );
    let err = serde_json::to_string(&ProtocolError::new(ErrorCode::ShuttingDown, "bye").to_reply())
        .unwrap();
    let e = read_reply::<FilesView>(&err).unwrap_err();
    assert_eq!(
        (e.code, e.message.as_str()),
        (ErrorCode::ShuttingDown, "bye")
    );
    let e = read_reply::<FilesView>(r#"{"v":1,"ok":true,"generation":"x"}"#).unwrap_err();
    assert_eq!(e.code, ErrorCode::BadResponse);
    assert!(e.message.contains("generation"), "{}", e.message);
}

#[test]
fn records_round_trip_and_unknown_kinds_are_other() {
    let r = Record {
        v: Version,
        t: 12.5,
        event: Event::PassEnd(PassEnd {
            epoch: 0,
            mini_epoch: 1,
            sequence: 1,
            pass: 2,
            verdict: metfs_feedback::policy::Verdict::Advance,
            score: None,
            view_bytes: 10,
            secs: Some(0.5),
        }),
    };
    let line = serde_json::to_string(&r).unwrap();
    assert!(line.contains(r#""event":"pass_end""#), "{line}");
    assert!(line.contains(r#""v":1"#), "{line}");
    assert_eq!(serde_json::from_str::<Record>(&line).unwrap(), r);
    let t: Record = serde_json::from_str(r#"{"t":1,"event":"tier","tier_bytes_read":7}"#).unwrap();
    assert_eq!(t.event, Event::Tier(Tier { tier_bytes_read: 7 }));
    let o: Record = serde_json::from_str(r#"{"v":1,"t":1,"event":"new_kind","x":1}"#).unwrap();
    assert_eq!(o.event, Event::Other);
}

proptest::proptest! {
    /// A packed list reads back as the paths packed, in order, whatever their bytes; a payload
    /// cut short, grown, or with an offset changed is refused, never read wrong or panicked on.
    #[test]
    fn packed_lists_read_back_and_damage_is_refused(
        paths in proptest::collection::vec("[a-z/\u{e9}\u{4e2d} ]{0,12}", 0..40),
        cut in 1usize..16,
        poke in proptest::prelude::any::<(usize, u8)>(),
    ) {
        let (header, bytes) = PackedList::pack(paths.iter().map(String::as_str));
        let count = paths.len() as u64;
        proptest::prop_assert_eq!(header.bytes as usize, bytes.len());
        proptest::prop_assert_eq!(header.unpack(count, &bytes).unwrap(), paths.clone());
        let short = &bytes[..bytes.len().saturating_sub(cut)];
        proptest::prop_assert!(header.unpack(count, short).is_err());
        let mut long = bytes.clone();
        long.push(0);
        proptest::prop_assert!(header.unpack(count, &long).is_err());
        // Damage one offset: either refused, or (when the damage keeps them ordered and in
        // bounds) read as other valid UTF-8 strings, never a panic.
        let mut bad = bytes.clone();
        let at = poke.0 % (8 * (paths.len() + 1));
        bad[at] ^= poke.1 | 1;
        let _ = header.unpack(count, &bad);
    }
}

/// `pass_end`'s signals beside its metrics: the run's progress and the fresh-data loss, each
/// optional, checked, and the field named when refused.
#[test]
fn pass_end_signals_are_checked_and_named() {
    let r = parse_request(r#"{"op":"pass_end","metrics":{},"progress":0.25,"fresh_loss":1.5}"#)
        .unwrap();
    assert!(matches!(
        r,
        Request::PassEnd {
            progress: Some(p),
            fresh_loss: Some(f),
            ..
        } if p == 0.25 && f == 1.5
    ));
    for (line, field) in [
        (r#"{"op":"pass_end","progress":1.5}"#, "progress"),
        (r#"{"op":"pass_end","progress":-0.01}"#, "progress"),
        (r#"{"op":"pass_end","progress":"half"}"#, "progress"),
        (r#"{"op":"pass_end","fresh_loss":null}"#, "fresh_loss"),
        (r#"{"op":"pass_end","fresh_loss":[1]}"#, "fresh_loss"),
    ] {
        match parse_request(line) {
            Err(e) => {
                assert_eq!(e.code, ErrorCode::BadMetrics, "{line}: {e}");
                assert!(e.message.contains(&format!("`{field}`")), "{line}: {e}");
            }
            Ok(r) => panic!("{line} parsed as {r:?}"),
        }
    }
    // Absent, they are absent from what a client writes too.
    let r = parse_request(r#"{"op":"pass_end"}"#).unwrap();
    let line = serde_json::to_string(&r).unwrap();
    assert!(
        !line.contains("progress") && !line.contains("fresh_loss"),
        "{line}"
    );
}
