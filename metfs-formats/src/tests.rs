//! Detection, classification and views across the formats, and the round trip of any subset.

use super::*;
use proptest::prelude::*;
use serde_json::json;

type Indexes = BTreeMap<String, Vec<u8>>;

fn hf_state(names: &[String]) -> Value {
    json!({
        "_data_files": names.iter().map(|n| json!({"filename": n})).collect::<Vec<_>>(),
        "_fingerprint": "5f1e8c7a2b3d4e6f",
        "_format_columns": null, "_format_kwargs": {}, "_format_type": null,
        "_output_all_columns": false, "_split": null,
    })
}

fn arrows(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("data-{i:05}-of-{n:05}.arrow"))
        .collect()
}

/// A `Dataset` directory of `n` arrow files: (listing, index bytes).
fn hf_dataset(n: usize) -> (Vec<String>, Indexes) {
    let mut files = arrows(n);
    files.extend([
        "state.json".into(),
        "dataset_info.json".into(),
        "cache-1234.arrow".into(),
    ]);
    let idx = [(
        "state.json".into(),
        serde_json::to_vec(&hf_state(&arrows(n))).unwrap(),
    )]
    .into();
    (files, idx)
}

fn mds_dataset(n: usize) -> (Vec<String>, Indexes) {
    let shards: Vec<Value> = (0..n)
        .map(|i| {
            json!({
                "column_encodings": ["int", "bytes"], "column_names": ["id", "data"],
                "column_sizes": [8, null], "compression": null, "format": "mds", "hashes": [],
                "raw_data": {"basename": format!("shard.{i:05}.mds"), "bytes": 1 << 10, "hashes": {}},
                "samples": 7, "size_limit": 1 << 10, "version": 2, "zip_data": null,
            })
        })
        .collect();
    let mut files: Vec<String> = (0..n).map(|i| format!("shard.{i:05}.mds")).collect();
    files.push("index.json".into());
    let idx = [(
        "index.json".into(),
        serde_json::to_vec(&json!({"version": 2, "shards": shards})).unwrap(),
    )]
    .into();
    (files, idx)
}

fn litdata_dataset(n: usize) -> (Vec<String>, Indexes) {
    let chunks: Vec<Value> = (0..n)
        .map(|i| json!({"chunk_bytes": 999, "chunk_size": 5, "dim": null, "filename": format!("chunk-0-{i}.bin")}))
        .collect();
    let mut files: Vec<String> = (0..n).map(|i| format!("chunk-0-{i}.bin")).collect();
    files.push("index.json".into());
    let index = json!({"chunks": chunks, "config": {"chunk_size": 5, "compression": null}, "updated_at": "17.5"});
    (
        files,
        [("index.json".into(), serde_json::to_vec(&index).unwrap())].into(),
    )
}

fn wds_dataset(n: usize) -> (Vec<String>, Indexes) {
    let mut files = Vec::new();
    for i in 0..n {
        files.push(format!("shards/{i:04}.tar"));
        files.push(format!("shards/{i:04}.idx"));
    }
    (files, Indexes::new())
}

fn read_all(files: &[String], idx: &Indexes) -> Indexes {
    wanted(files)
        .into_iter()
        .filter_map(|f| idx.get(&f).map(|b| (f, b.clone())))
        .collect()
}

fn detect_ok(files: &[String], idx: &Indexes) -> Layout {
    detect(files, &read_all(files, idx), &Options::default())
        .unwrap()
        .expect("a format")
}

#[test]
fn each_format_is_detected_and_classified() {
    let (files, idx) = hf_dataset(4);
    let l = detect_ok(&files, &idx);
    assert_eq!(l.format(), Format::HfDataset);
    assert_eq!(l.index_files(), ["state.json"]);
    assert_eq!(l.always(), ["dataset_info.json"]);
    assert_eq!(l.shards().len(), 4);
    assert_eq!(l.other(), ["cache-1234.arrow"]);

    let (files, idx) = mds_dataset(3);
    let l = detect_ok(&files, &idx);
    assert_eq!(
        (l.format(), l.index_files(), l.shards().len()),
        (Format::Mds, vec!["index.json"], 3)
    );

    let (files, idx) = litdata_dataset(3);
    assert_eq!(detect_ok(&files, &idx).format(), Format::Litdata);

    let (files, idx) = wds_dataset(3);
    let l = detect_ok(&files, &idx);
    assert_eq!(l.format(), Format::WebDataset);
    assert!(l.index_files().is_empty());
    assert_eq!(l.shards()[1].files, ["shards/0001.tar", "shards/0001.idx"]);

    let plain = ["images/a.png".to_string(), "classes.txt".to_string()];
    assert!(detect(&plain, &Indexes::new(), &Options::default())
        .unwrap()
        .is_none());
}

#[test]
fn a_view_names_its_shards_by_any_of_their_files_and_lists_its_files() {
    let (files, idx) = wds_dataset(3);
    let l = detect_ok(&files, &idx);
    let v = l
        .view(&["shards/0002.idx", "shards/0000.tar", "shards/0002.tar"])
        .unwrap();
    assert_eq!(v.shards, [0, 2]);
    assert_eq!(
        v.files,
        [
            "shards/0000.tar",
            "shards/0000.idx",
            "shards/0002.tar",
            "shards/0002.idx"
        ]
    );
    assert!(v.indexes.is_empty());
}

#[test]
fn a_dataset_dict_deals_its_splits_and_shows_always_splits_whole() {
    let mut files = vec!["dataset_dict.json".to_string()];
    let mut idx = Indexes::new();
    idx.insert(
        "dataset_dict.json".into(),
        br#"{"splits": ["train", "test"]}"#.to_vec(),
    );
    for (split, n) in [("train", 4), ("test", 2)] {
        for a in arrows(n) {
            files.push(format!("{split}/{a}"));
        }
        files.push(format!("{split}/state.json"));
        files.push(format!("{split}/dataset_info.json"));
        idx.insert(
            format!("{split}/state.json"),
            serde_json::to_vec(&hf_state(&arrows(n))).unwrap(),
        );
    }
    let read = read_all(&files, &idx);
    let dealt = detect(&files, &read, &Options::default()).unwrap().unwrap();
    assert_eq!(dealt.format(), Format::HfDatasetDict);
    assert_eq!(dealt.index_files(), ["train/state.json", "test/state.json"]);
    assert_eq!(dealt.shards().len(), 6);
    // A view without a test shard leaves a dealt split empty, which load_from_disk refuses.
    let err = dealt
        .view(&["train/data-00000-of-00004.arrow"])
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "test/state.json: the view holds none of this split's arrow files (every dealt split needs one; \
         or show the split whole in every view as an always split)"
    );

    let options = Options {
        always_splits: vec!["test".into()],
    };
    let l = detect(&files, &read, &options).unwrap().unwrap();
    assert_eq!(l.index_files(), ["train/state.json"]);
    assert_eq!(l.shards().len(), 4);
    assert!(l.always().contains(&"test/state.json".to_string()));
    assert!(l
        .always()
        .contains(&"test/data-00001-of-00002.arrow".to_string()));
    let v = l.view(&["train/data-00003-of-00004.arrow"]).unwrap();
    let state: Value = serde_json::from_slice(&v.indexes[0].1).unwrap();
    assert_eq!(
        state["_data_files"],
        json!([{"filename": "data-00003-of-00004.arrow"}])
    );
    assert!(v.files.contains(&"test/dataset_info.json".to_string()));

    let bad = Options {
        always_splits: vec!["validation".into()],
    };
    assert_eq!(
        detect(&files, &read, &bad).unwrap_err().to_string(),
        "dataset_dict.json: has no split 'validation' (its splits: train, test)"
    );
}

#[test]
fn bad_input_names_the_file() {
    let (files, mut idx) = hf_dataset(2);
    idx.insert("state.json".into(), b"{\"_data_files\": [".to_vec());
    let err = detect(&files, &idx, &Options::default()).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("state.json: does not parse as JSON: "),
        "{err}"
    );

    let (files, mut idx) = mds_dataset(2);
    idx.insert("index.json".into(), b"not json".to_vec());
    let err = detect(&files, &idx, &Options::default()).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("index.json: does not parse as JSON: "),
        "{err}"
    );
    idx.insert("index.json".into(), b"{\"version\": 2}".to_vec());
    let err = detect(&files, &idx, &Options::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "index.json: neither an MDS index (a `shards` list) nor a litdata index (`chunks` and `config`)"
    );

    let (files, idx) = mds_dataset(3);
    let err = detect(&files[1..], &idx, &Options::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "index.json: names the shard 'shard.00000.mds', and no file of it is in the listing"
    );
    let l = detect_ok(&files, &idx);
    assert_eq!(
        l.view(&["shard.00009.mds"]).unwrap_err().to_string(),
        "index.json: names no shard 'shard.00009.mds' (the view asks for it)"
    );
    let none: [&str; 0] = [];
    assert_eq!(
        l.view(&none).unwrap_err().to_string(),
        "index.json: a view holds at least one shard; this one holds none"
    );

    let (files, _) = hf_dataset(2);
    let err = detect(&files, &Indexes::new(), &Options::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "state.json: listed but its bytes were not passed in (read every file `wanted` names)"
    );

    let (mut files, idx) = hf_dataset(2);
    files.retain(|f| f != "dataset_info.json");
    files.push("dataset_dict.json".into());
    // Without dataset_info.json the root is no `Dataset`; it is read as a `DatasetDict`.
    let err = layout(Format::HfDataset, &files, &idx, &Options::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "state.json: needs 'dataset_info.json', which is not in the listing"
    );

    let err = layout(
        Format::Litdata,
        &["a.bin"],
        &Indexes::new(),
        &Options::default(),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "index.json: not in the listing, and the litdata format needs it"
    );
    let err = layout(
        Format::TfRecord,
        &["a.bin"],
        &Indexes::new(),
        &Options::default(),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "no tfrecord shard in the listing (suffixes .tfrecord .tfrecords .tfrec .tfrecord.gz)"
    );
}

#[test]
fn format_names_round_trip() {
    for f in Format::ALL {
        assert_eq!(Format::from_name(f.name()), Some(f));
    }
    assert_eq!(Format::from_name("parquet"), None);
}

/// Every field of the index but the ones a view rewrites.
fn carried(format: Format, index: &[u8]) -> Value {
    let mut v: Value = serde_json::from_slice(index).unwrap();
    let o = v.as_object_mut().unwrap();
    for k in match format {
        Format::HfDataset => &["_data_files", "_fingerprint"][..],
        Format::Mds => &["shards"][..],
        Format::Litdata => &["chunks", "updated_at"][..],
        _ => &[][..],
    } {
        o.remove(*k);
    }
    v
}

proptest! {
    /// Any non-empty subset of shards round-trips: the view's rewritten index parses, names
    /// exactly that subset in the source's order, and carries every other field unchanged.
    #[test]
    fn any_subset_round_trips(which in 0usize..4, n in 1usize..24, mask in any::<u32>()) {
        let (files, idx) = match which {
            0 => hf_dataset(n),
            1 => mds_dataset(n),
            2 => litdata_dataset(n),
            _ => wds_dataset(n),
        };
        let l = detect_ok(&files, &idx);
        let mut keep: BTreeSet<usize> = (0..n).filter(|i| mask >> (i % 32) & 1 == 1).collect();
        if keep.is_empty() {
            keep.insert(mask as usize % n);
        }
        // Asked for in reverse: the index still follows the source's order.
        let names: Vec<&str> = keep.iter().rev().map(|&i| l.shards()[i].name.as_str()).collect();
        let v = l.view(&names).unwrap();
        let mut listing = v.files.clone();
        listing.extend(v.indexes.iter().map(|(f, _)| f.clone()));
        let again = detect_ok(&listing, &v.indexes.iter().cloned().collect());
        prop_assert_eq!(again.format(), l.format());
        let want: Vec<&Shard> = keep.iter().map(|&i| &l.shards()[i]).collect();
        let got: Vec<&Shard> = again.shards().iter().collect();
        prop_assert_eq!(got, want);
        prop_assert!(again.other().is_empty(), "{:?}", again.other());
        for (file, bytes) in &v.indexes {
            prop_assert_eq!(carried(l.format(), bytes), carried(l.format(), &idx[file]));
        }
        // The same set gives the same bytes.
        prop_assert_eq!(l.view_of(&keep).unwrap(), v);
    }
}
