use super::inspect::digits;
use super::source::runs;

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
