//! Unit tests of the S3 tier that need no server (URLs, key decoding, scrubbing, config,
//! classification, vectored writes); the Garage tests in `tests/` cover the rest.

use bytes::Bytes;

use crate::catalog::CatalogEntry;

use super::client::parse_s3_url;
use super::errors::scrub_with;
use super::fetch::pwritev_all;
use super::listing::{decode_key, Item};
use super::*;

#[test]
fn vectored_writes_put_every_byte_in_place() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("f");
    let file = std::fs::File::create(&path).unwrap();
    // More buffers than one pwritev takes, empty ones among them, written at an offset.
    let bufs: Vec<Bytes> = (0..700u32)
        .map(|i| Bytes::from(vec![(i % 251) as u8; (i % 7) as usize * 3]))
        .collect();
    pwritev_all(&file, &bufs, 5).unwrap();
    let want: Vec<u8> = std::iter::repeat_n(0u8, 5)
        .chain(bufs.iter().flat_map(|b| b.iter().copied()))
        .collect();
    assert_eq!(std::fs::read(&path).unwrap(), want);
    // A batch of empty frames (a stream may end with one) writes nothing and succeeds.
    pwritev_all(&file, &[Bytes::new(), Bytes::new()], 1 << 20).unwrap();
    pwritev_all(&file, &[], 0).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), want);
}

#[test]
fn urls() {
    assert_eq!(
        parse_s3_url("s3://b/x/y/").unwrap(),
        ("b".to_string(), "x/y".to_string())
    );
    assert_eq!(
        parse_s3_url("s3://b").unwrap(),
        ("b".to_string(), String::new())
    );
    assert!(parse_s3_url("s3://b/a/../c").is_err());
    assert!(parse_s3_url("http://b/c").is_err());
    let e = parse_s3_url("s3://AKID:SECRETSECRET@b/c").unwrap_err();
    assert!(!e.to_string().contains("SECRETSECRET"), "{e}");
}

#[test]
fn keys_decode_like_s3() {
    assert_eq!(decode_key("a+b%2Bc%2Fd").unwrap(), "a b+c/d");
    assert_eq!(decode_key("%C3%A9").unwrap(), "é");
    assert!(decode_key("%FF").is_err());
}

#[test]
fn scrubbing() {
    let s = scrub_with(
        &["topsecretvalue".to_string()],
        "GET http://h/b/?list-type=2&X-Amz-Credential=AK%2F1&X-Amz-Signature=abcdef x topsecretvalue",
    );
    assert!(!s.contains("abcdef") && !s.contains("topsecretvalue") && !s.contains("AK%2F1"));
    assert!(s.contains("list-type=2"), "{s}");
}

#[test]
fn config_from_toml_like_json() {
    let c: S3Config = serde_json::from_str(
        r#"{"endpoint":"http://127.0.0.1:3900","part_size":"16MiB","secret_access_key":"s3cr3tvalue","access_key_id":"GK1"}"#,
    )
    .unwrap();
    assert_eq!(c.part_size, 16 << 20);
    assert!(!format!("{c:?}").contains("s3cr3tvalue"));
    assert!(!serde_json::to_string(&c).unwrap().contains("s3cr3tvalue"));
    assert!(serde_json::from_str::<S3Config>(r#"{"part_sise":1}"#).is_err());
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn resolution_order() {
    let e = env(&[
        ("AWS_ENDPOINT_URL", "http://127.0.0.1:9"),
        ("AWS_REGION", "from-env"),
        ("AWS_ALLOW_HTTP", "true"),
        ("AWS_ACCESS_KEY_ID", "GKENV"),
        ("AWS_SECRET_ACCESS_KEY", "envsecretvalue"),
    ]);
    let t = S3Tier::with_env("s3://bkt/p", S3Config::default(), e.clone()).unwrap();
    assert_eq!(t.region(), "from-env");
    assert_eq!(t.endpoint(), "http://127.0.0.1:9");
    let cfg = S3Config {
        endpoint: Some("http://127.0.0.1:10".into()),
        region: Some("explicit".into()),
        access_key_id: Some("GKX".into()),
        secret_access_key: Some(Secret::new("explicitsecret")),
        ..Default::default()
    };
    let t = S3Tier::with_env("s3://bkt/p/", cfg, e).unwrap();
    assert_eq!(t.region(), "explicit");
    assert_eq!(t.endpoint(), "http://127.0.0.1:10");
    assert_eq!(t.url(), "s3://bkt/p");
    let dbg = format!("{t:?}");
    assert!(!dbg.contains("explicitsecret") && !dbg.contains("envsecretvalue"));
    // Plain HTTP needs consent.
    let err = S3Tier::with_env(
        "s3://bkt",
        S3Config {
            endpoint: Some("http://127.0.0.1:10".into()),
            ..Default::default()
        },
        Vec::new(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("allow_http"), "{err}");
}

#[test]
fn classification() {
    let t = S3Tier::with_env(
        "s3://bkt/p",
        S3Config {
            endpoint: Some("http://127.0.0.1:10".into()),
            allow_http: Some(true),
            ..Default::default()
        },
        Vec::new(),
    )
    .unwrap();
    let skip = |k: &str| match t.classify(Ok(k.to_string()), 1, String::new(), None) {
        Item::Skip(key, why) => {
            assert_eq!(key, k);
            why
        }
        Item::Entry(e) => panic!("{k} accepted as {}", e.path),
    };
    assert!(skip("p/a/../b").contains("`..`"));
    assert!(skip("p//abs").contains("absolute"));
    assert!(skip("p/a//b").contains("empty path segment"));
    assert!(skip("p/a/./b").contains("`.`"));
    assert!(skip("p/dir/").contains("directory marker"));
    assert!(skip("p/").contains("directory marker"));
    assert!(skip("p/a\u{1}b").contains("control"));
    assert!(skip("pq/x").contains("outside"));
    match t.classify(Ok("p/a b/c+d".into()), 7, "\"e\"".into(), None) {
        Item::Entry(e) => {
            assert_eq!(
                (e.path.as_str(), e.size, e.version.as_str()),
                ("a b/c+d", 7, "\"e\"")
            )
        }
        Item::Skip(_, why) => panic!("{why}"),
    }
    assert!(matches!(t.locate("a/../b"), Err(TierError::Escapes { .. })));
    assert_eq!(t.locate("a b/c").unwrap().as_ref(), "p/a b/c");
}

#[test]
fn catalog_helpers() {
    let cat = Catalog::from_entries(
        "x",
        ["a-b", "a/b", "a/c/d", "z"].map(|p| CatalogEntry::new(p, 1)),
    )
    .unwrap();
    assert!(catalog_path_is(&cat, 1, "a/b"));
    assert!(!catalog_path_is(&cat, 1, "a/c"));
    assert!(catalog_has_dir(&cat, "a"));
    assert!(catalog_has_dir(&cat, "a/c"));
    assert!(!catalog_has_dir(&cat, "a-b"));
    assert!(!catalog_has_dir(&cat, "z"));
}
