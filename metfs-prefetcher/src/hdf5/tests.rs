use super::ffi::space::runs;
use super::inspect::digits;

#[test]
fn runs_coalesce_neighbours() {
    let r: Vec<_> = runs(&[1, 2, 3, 7, 9, 10]).collect();
    assert_eq!(r, vec![(1, 3), (7, 1), (9, 2)]);
    assert_eq!(runs(&[]).count(), 0);
}

#[test]
fn digits_of_last_row() {
    assert_eq!(digits(0), 1);
    assert_eq!(digits(9), 1);
    assert_eq!(digits(10), 2);
    assert_eq!(digits(9_999_999), 7);
}

/// The safe wrappers refuse what would let the library write or read past a buffer, or follow
/// bytes as pointers, with an error instead.
#[test]
fn ffi_refuses_short_buffers_and_variable_length_types() {
    use super::ffi::io::{read, write, Obj};
    use super::ffi::space::{select_hyperslab, simple_space};
    use super::ffi::types::{native, type_copy, Native};
    use super::ffi::{create_dataset, create_file, dataset_type, Cx};
    use hdf5_sys::h5p::H5P_DEFAULT;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f.h5");
    let cx = Cx { file: "f.h5" };
    let f = create_file(cx, &path).unwrap();
    let space = simple_space(cx, &[10, 3], None).unwrap();
    let u64t = native(Native::U64);
    let d = create_dataset(cx, f.0, "x", u64t, space.0, H5P_DEFAULT, H5P_DEFAULT).unwrap();
    let rows: Vec<u64> = (0..30).collect();
    let whole = |d| Obj::Dataset {
        d,
        mspace: None,
        fspace: None,
    };
    // One element short of the 30 the dataset holds: refused, for writes and reads.
    let e = write(cx, || "w".into(), d.0, None, None, u64t, &rows[..29]).unwrap_err();
    assert!(e.to_string().contains("buffer of 232 bytes for 240"), "{e}");
    write(cx, || "w".into(), d.0, None, None, u64t, &rows).unwrap();
    let mut back = vec![0u64; 29];
    assert!(read(cx, || "r".into(), whole(d.0), u64t, &mut back).is_err());
    let mut back = vec![0u64; 30];
    read(cx, || "r".into(), whole(d.0), u64t, &mut back).unwrap();
    assert_eq!(back, rows);
    // Bytes are counted, not elements: 30 u64 values do not fit 30 bytes.
    let mut small = vec![0u8; 30];
    assert!(read(cx, || "r".into(), whole(d.0), u64t, &mut small).is_err());
    // A selection's arrays must have the dataspace's rank.
    assert!(select_hyperslab(cx, || "s".into(), space.0, &[0], &[1], None).is_err());
    // A variable-length string type would make the library write (or follow) pointers.
    let vt = ::hdf5::Datatype::from_type::<::hdf5::types::VarLenUnicode>().unwrap();
    let vt_id = vt.id();
    let e = read(cx, || "r".into(), whole(d.0), vt_id, &mut back).unwrap_err();
    assert!(e.to_string().contains("variable-length"), "{e}");
    let e = write(cx, || "w".into(), d.0, None, None, vt_id, &rows).unwrap_err();
    assert!(e.to_string().contains("variable-length"), "{e}");
    // A copy of a fixed-size type is fine.
    let t = type_copy(cx, dataset_type(cx, d.0).unwrap().0).unwrap();
    read(cx, || "r".into(), whole(d.0), t.0, &mut back).unwrap();
}
