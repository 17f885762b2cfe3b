use super::*;

fn filter(f: &str) -> TagFilter {
    TagFilter::new(f).unwrap_or_else(|e| panic!("{f:?}: {e}"))
}

#[test]
fn perl_classes_are_ascii_as_in_go() {
    // `é` is a Unicode word character; Go's `\w` does not take it.
    assert!(!filter(r"^\w+$").is_match("café"));
    assert!(filter(r"^\w+$").is_match("serve_01"));
    assert!(filter(r"^\W$").is_match("é"));
    assert!(!filter(r"\d").is_match("٣"), "Arabic-Indic digit");
    assert!(filter(r"^\D$").is_match("٣"));
    assert!(filter(r"^\s$").is_match("\t"));
    // Go's `\s` has no vertical tab, nor Unicode spaces.
    assert!(!filter(r"\s").is_match("\u{0B}") && !filter(r"\s").is_match("\u{A0}"));
    assert!(filter(r"^\S$").is_match("\u{0B}"));
}

#[test]
fn perl_classes_inside_brackets_and_negated_brackets_are_ascii() {
    assert!(!filter(r"^[\w-]+$").is_match("café-1"));
    assert!(filter(r"^[\w-]+$").is_match("cafe-1"));
    assert!(filter(r"^[^\w]$").is_match("é"));
    assert!(!filter(r"^[^\w]$").is_match("a"));
    assert!(filter(r"^[\W]$").is_match("é") && !filter(r"^[\W]$").is_match("_"));
    assert!(filter(r"^[^\W\d]+$").is_match("abc") && !filter(r"^[^\W\d]+$").is_match("a1"));
    assert!(filter(r"^[\s\d]+$").is_match("1 2") && !filter(r"^[\s\d]+$").is_match("1\u{0B}2"));
    assert!(filter(r"^[[:alpha:]\d]+$").is_match("a1") && !filter(r"^[[:alpha:]\d]+$").is_match("é"));
}

#[test]
fn word_boundaries_are_ascii() {
    // Between `é` and `x` Go sees a boundary (é is no ASCII word character).
    assert!(filter(r"\bx").is_match("éx"));
    assert!(!filter(r"\Bx").is_match("éx"));
    assert!(filter(r"\bserve\b").is_match("a-serve-1") && !filter(r"\bserve\b").is_match("aserve"));
}

#[test]
fn everything_else_keeps_its_unicode_meaning() {
    assert!(filter(r"^\pL+$").is_match("café"));
    assert!(filter(r"^\p{Greek}$").is_match("λ"));
    assert!(filter(r"^.$").is_match("é"));
    assert!(filter(r"(?i)^straße$").is_match("STRASSE") == filter(r"(?i)^straße$").is_match("STRASSE"));
    assert!(filter(r"(?i)^é$").is_match("É"));
    // As in Go, `(?i)` folds `k` to the Kelvin sign, also in an ASCII class.
    assert!(filter(r"(?i)^\w$").is_match("\u{212A}"));
    assert!(filter(r"^(a|b)\.c{2,3}$").is_match("b.ccc"));
}

#[test]
fn class_set_operations_are_refused_as_go_reads_them_literally() {
    for f in [r"[a-z&&[^x]]", r"[a-z--x]", r"[a~~b]"] {
        let e = TagFilter::new(f).unwrap_err().to_string();
        assert!(e.contains("class set operation"), "{f}: {e}");
    }
}

#[test]
fn go_syntax_is_checked() {
    assert!(TagFilter::new(r"(?x)a").unwrap_err().to_string().contains("flag"));
    assert!(TagFilter::new(r"a{1001}").unwrap_err().to_string().contains("1000"));
    assert!(!TagFilter::new("((").unwrap_err().too_costly());
    assert!(TagFilter::new(r"\<a").is_err());
    assert!(TagFilter::new("").is_err() && TagFilter::new(&"a".repeat(1025)).is_err());
    assert!(TagFilter::new("((").is_err());
}

/// The filter of issue 24: Unicode `\w` made it ~13 MB; with Go's ASCII `\w` it is small.
#[test]
fn a_repeated_word_class_is_cheap() {
    let f = filter(r"[\w]{200}r0");
    eprintln!("[\\w]{{200}}r0 costs {} bytes", f.cost());
    assert!(f.cost() <= 256 * 1024, "{}", f.cost());
    assert!(f.is_match(&format!("{}r0", "a".repeat(200))));
}

#[test]
fn the_largest_literal_and_common_filters_fit() {
    for f in [
        format!("^{}", "a".repeat(1023)),
        r"(?i)^[a-z0-9-]{1,63}$".to_owned(),
        r"^serve-".to_owned(),
        r"\pL".to_owned(),
        r"(?i)\pL{4}".to_owned(),
        r"\pL{6}".to_owned(),
        r"[\w]{1000}".to_owned(),
        r"(?s).{200}".to_owned(),
    ] {
        let c = filter(&f).cost();
        eprintln!("{f:.40} costs {c} bytes");
        assert!(c <= MAX_TAG_FILTER_COST);
    }
}

/// Unicode classes repeated: refused while compiling (the program limit) or once
/// measured (the cost limit), never held.
#[test]
fn unicode_classes_repeated_past_the_limit_are_refused() {
    for f in [r"\pL{1000}", r"\pL{8}", r"(?i)\pL{20}", r"[^a]{1000}", r".{1000}", r"\PL{8}"] {
        let e = TagFilter::new(f).unwrap_err();
        assert!(e.too_costly() && e.to_string().contains("too costly"), "{f}: {e}");
    }
}

#[test]
fn cost_is_deterministic() {
    assert_eq!(filter(r"(?i)^serve-\w+").cost(), filter(r"(?i)^serve-\w+").cost());
}
