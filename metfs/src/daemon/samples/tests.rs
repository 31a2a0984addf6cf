//! Tests of the samples a queue deals and of `apply`, on real source directories.

use super::*;
use crate::config::SampleConfig;
use metfs_formats::select::{GroupBy, Patterns};
use metfs_tier::PosixTier;

/// A source of `pairs` images (5,000 bytes) and masks (1,000 bytes), and a class list.
pub(in crate::daemon) fn source(pairs: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for sub in ["images", "masks"] {
        std::fs::create_dir(dir.path().join(sub)).unwrap();
    }
    for i in 0..pairs {
        std::fs::write(dir.path().join(format!("images/{i}.png")), [1u8; 5000]).unwrap();
        std::fs::write(dir.path().join(format!("masks/{i}.png")), [2u8; 1000]).unwrap();
    }
    std::fs::write(dir.path().join("classes.txt"), b"bg fg\n").unwrap();
    dir
}

async fn applied(
    dir: &Path,
    settings: &SampleConfig,
    manifest: Option<&Path>,
    tier: bool,
) -> Result<Applied, SamplesError> {
    let catalog = match manifest {
        Some(m) => metfs_prefetcher::manifest::load_catalog(m).unwrap(),
        None => {
            PosixTier::new(dir)
                .unwrap()
                .catalog()
                .await
                .unwrap()
                .catalog
        }
    };
    let posix = PosixTier::new(dir).unwrap();
    let tier = tier.then_some(&posix as &dyn CapacityTier);
    let on = SampleSource {
        settings,
        manifest,
        source: "the source",
    };
    let tmp = tempfile::tempdir().unwrap();
    apply(&on, catalog, tier, tmp.path(), Staged::Copy).await
}

/// What a queue deals under `group_by` and `always`: one sample per pair whose footprint is
/// both files' blocks, the always file in none, and the record naming the settings; the
/// slot a claim may fill is a slot less the always file.
#[tokio::test]
async fn a_queue_deals_groups_by_their_whole_footprint() {
    let dir = source(6);
    let settings = SampleConfig {
        group_by: Some(GroupBy::parse("images/{}.png,masks/{}.png").unwrap()),
        always: Patterns::new("always", &["classes.txt"]).unwrap(),
        ..SampleConfig::default()
    };
    let a = applied(dir.path(), &settings, None, true).await.unwrap();
    let samples = a.samples.as_ref();
    let (owned, record) = queue_samples(&settings, &a.catalog, &a.footprints, samples);
    assert_eq!(
        owned.sizes,
        vec![3 * 4096; 6],
        "8 KiB of image, 4 KiB of mask"
    );
    assert_eq!(
        record.as_deref(),
        Some("group_by 'images/{}.png,masks/{}.png', always 'classes.txt'")
    );
    assert_eq!(
        dealt_slot_bytes(samples, &a.catalog, 1 << 20, 100_000).unwrap(),
        100_000 - 4096
    );
    let e = dealt_slot_bytes(samples, &a.catalog, 1 << 20, 4096).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("always: the files in every view (classes.txt)"),
        "{e}"
    );
    // Without settings every file is a sample and the record is none.
    let plain = SampleConfig::default();
    let a = applied(dir.path(), &plain, None, true).await.unwrap();
    let (owned, record) = queue_samples(&plain, &a.catalog, &a.footprints, None);
    assert_eq!((owned.sizes.len(), record), (13, None));
}

/// A `group_by` that groups no two files is an error naming it.
#[tokio::test]
async fn a_group_by_that_groups_nothing_is_an_error_naming_it() {
    let dir = source(3);
    let settings = SampleConfig {
        group_by: Some(GroupBy::parse("img/{}.png,msk/{}.png").unwrap()),
        ..SampleConfig::default()
    };
    let e = applied(dir.path(), &settings, None, true)
        .await
        .err()
        .unwrap();
    assert!(
        e.to_string()
            .starts_with("group_by 'img/{}.png,msk/{}.png' groups no two files of the source"),
        "{e}"
    );
}

/// A manifest's group column groups files and is named in the record; a format's index
/// file with no source to read it from is an error naming the file.
#[tokio::test]
async fn the_manifest_groups_and_an_index_needs_a_source() {
    let dir = source(2);
    let m = dir.path().join("manifest.csv");
    let mut text = String::from("path,size,group\n");
    for i in 0..2 {
        text += &format!("images/{i}.png,5000,p{i}\nmasks/{i}.png,1000,p{i}\n");
    }
    std::fs::write(&m, text).unwrap();
    let settings = SampleConfig::default();
    let a = applied(dir.path(), &settings, Some(&m), true)
        .await
        .unwrap();
    let (owned, record) = queue_samples(&settings, &a.catalog, &a.footprints, a.samples.as_ref());
    assert_eq!(owned.sizes.len(), 2);
    assert_eq!(record.as_deref(), Some("the manifest's group column"));
    std::fs::remove_file(&m).unwrap();
    std::fs::write(dir.path().join("index.json"), b"{}").unwrap();
    let e = applied(dir.path(), &settings, None, false)
        .await
        .err()
        .unwrap();
    assert!(
        e.to_string()
            .starts_with("index.json: a dataset format's index file"),
        "{e}"
    );
}

/// A catalog of a directory holding `files` (a few bytes each).
async fn catalog_of(files: &[&str]) -> (tempfile::TempDir, Catalog) {
    let dir = tempfile::tempdir().unwrap();
    for f in files {
        let p = dir.path().join(f);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, b"x").unwrap();
    }
    let c = PosixTier::new(dir.path()).unwrap().catalog().await.unwrap();
    (dir, c.catalog)
}

/// A mount that deals files one by one refuses a source in a format whose loader needs its
/// index (naming the format, the file that tells it and the mode), and takes it with
/// `--format files`; a source of plain files, or shards without index files, is taken.
#[tokio::test]
async fn a_format_is_refused_where_files_are_dealt_one_by_one() {
    let refused = [
        (
            &[
                "state.json",
                "dataset_info.json",
                "data-00000-of-00002.arrow",
            ][..],
            "state.json",
        ),
        (
            &["index.json", "shard.00000.mds", "shard.00001.mds"][..],
            "index.json",
        ),
        (
            &["a-000.tar", "a-000.idx", "a-001.tar", "a-001.idx"][..],
            "a-000.idx",
        ),
    ];
    for (files, evidence) in refused {
        let (_d, cat) = catalog_of(files).await;
        let e = refuse_format_not_dealt(&SampleConfig::default(), &cat, "a transform")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("({evidence})"))
                && e.contains("a transform deals files one by one")
                && e.contains("--format files"),
            "{e}"
        );
        let files_cfg = SampleConfig {
            format: FormatChoice::Files,
            ..SampleConfig::default()
        };
        refuse_format_not_dealt(&files_cfg, &cat, "a transform").unwrap();
    }
    for files in [&["a/1.png", "a/2.png"][..], &["a-000.tar", "a-001.tar"][..]] {
        let (_d, cat) = catalog_of(files).await;
        refuse_format_not_dealt(&SampleConfig::default(), &cat, "a transform").unwrap();
    }
}
