//! Tests of the rf policy configuration.

use super::*;
use crate::policy::{BandSide, CurrentPoint, PassState, Spread, Verdict};
use crate::Metrics;

fn key_of(e: ConfigError) -> &'static str {
    match e {
        ConfigError::Invalid { key, .. } => key,
        ConfigError::Policy(e) => panic!("not a config key error: {e}"),
    }
}

fn with(f: impl FnOnce(&mut PolicyConfig)) -> PolicyConfig {
    let mut c = PolicyConfig::default();
    f(&mut c);
    c
}

fn metrics(loss: f64, acc: f64, val: f64) -> Metrics {
    [("loss", loss), ("accuracy", acc), ("val_accuracy", val)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
}

fn at(sequence: u64, passes: u32) -> PassState {
    PassState::new(passes, sequence)
}

#[test]
fn defaults_are_documented_values_and_valid() {
    let c = PolicyConfig::default();
    assert_eq!(c.kind, PolicyKind::Fixed);
    assert_eq!((c.rf, c.rf_min, c.rf_max), (4, 1, 128));
    let terms: Vec<String> = c.score_metrics.iter().map(|t| t.to_string()).collect();
    assert_eq!(terms, ["loss", "1 - accuracy", "1 - val_accuracy"]);
    assert_eq!(c.weights(), [1.0, 1.0, 1.0]);
    assert_eq!((c.score_wait, c.best_scope), (3, Scope::Run));
    assert_eq!((c.bollinger_window, c.bollinger_k), (5, 2.0));
    assert_eq!(c.bollinger_scope, Scope::Run);
    assert_eq!(c.learned_fallback, FallbackKind::Score);
    assert_eq!(c.learned_metric, None);
    assert_eq!(c.replay_metric().unwrap().to_string(), "min:loss");
    assert!(!c.replay_metric().unwrap().is_named());
    c.validate().unwrap();
    // An empty table is the default config.
    assert_eq!(toml::from_str::<PolicyConfig>("").unwrap(), c);
}

#[test]
fn parses_toml_with_every_key() {
    let c: PolicyConfig = toml::from_str(
        r#"
        rf_policy = "bollinger"
        rf = 8
        rf_min = 2
        rf_max = 64
        score_metrics = ["loss", "1-val_accuracy"]
        score_weights = [1, 0.5]
        score_wait = 4
        best_scope = "per_mini_epoch"
        bollinger_window = 10
        bollinger_k = 1.5
        bollinger_scope = "per_mini_epoch"
        learned_fallback = "bollinger"
        learned_metric = "max:val_accuracy"
        "#,
    )
    .unwrap();
    c.validate().unwrap();
    assert_eq!(c.kind, PolicyKind::Bollinger);
    assert_eq!(c.score_metrics[1].to_string(), "1 - val_accuracy");
    assert_eq!(c.score_weights, Some(vec![1.0, 0.5]));
    assert_eq!(
        (c.best_scope, c.bollinger_scope),
        (Scope::PerMiniEpoch, Scope::PerMiniEpoch)
    );
    assert_eq!(
        c.replay_metric().unwrap(),
        "max:val_accuracy".parse().unwrap()
    );
    // Round trip through TOML.
    let back: PolicyConfig = toml::from_str(&toml::to_string(&c).unwrap()).unwrap();
    assert_eq!(back, c);
    let kind: PolicyConfig = toml::from_str("kind = \"learned\"").unwrap();
    assert_eq!(kind.kind, PolicyKind::Learned);
}

#[test]
fn bad_files_name_the_key() {
    for (text, needle) in [
        ("rf_polcy = \"score\"", "rf_polcy"),
        ("kind = \"adaptive\"", "adaptive"),
        ("score_metrics = [\"1 - \"]", "score_metrics"),
        ("best_scope = \"epoch\"", "epoch"),
        ("learned_fallback = \"learned\"", "learned"),
        ("learned_metric = \"val_accuracy\"", "learned_metric"),
    ] {
        let e = toml::from_str::<PolicyConfig>(text)
            .unwrap_err()
            .to_string();
        assert!(e.contains(needle), "{text}: {e}");
    }
}

#[test]
fn validation_names_the_key() {
    let cases: Vec<(PolicyConfig, &str, &str)> = vec![
        (with(|c| c.rf = 0), "rf", "at least 1"),
        (with(|c| c.rf_min = 0), "rf_min", "at least 1"),
        (with(|c| (c.rf_min, c.rf_max) = (5, 4)), "rf_max", "rf_min"),
        (with(|c| c.rf = 200), "rf", "outside"),
        (with(|c| (c.rf, c.rf_min) = (2, 3)), "rf", "outside"),
        (
            with(|c| c.score_weights = Some(vec![1.0, 1.0])),
            "score_weights",
            "2 weights for 3 metrics",
        ),
        (
            with(|c| c.score_weights = Some(vec![0.0; 3])),
            "score_weights",
            "zero",
        ),
        (
            with(|c| c.score_weights = Some(vec![1.0, f64::INFINITY, 1.0])),
            "score_weights",
            "finite",
        ),
        (
            with(|c| c.score_metrics.clear()),
            "score_metrics",
            "at least one",
        ),
        (
            with(|c| c.score_metrics.push("loss".parse().unwrap())),
            "score_metrics",
            "twice",
        ),
        (with(|c| c.score_wait = 0), "score_wait", "at least 1"),
        (
            with(|c| c.bollinger_window = 1),
            "bollinger_window",
            "at least 2",
        ),
        (
            with(|c| c.bollinger_k = 0.0),
            "bollinger_k",
            "greater than 0",
        ),
        (
            with(|c| c.bollinger_k = -1.0),
            "bollinger_k",
            "greater than 0",
        ),
        (with(|c| c.bollinger_k = f64::NAN), "bollinger_k", "finite"),
        (
            with(|c| {
                c.kind = PolicyKind::Bollinger;
                c.bollinger_scope = Scope::PerMiniEpoch;
                c.rf_max = 5;
            }),
            "bollinger_window",
            "never fill",
        ),
        (
            with(|c| {
                c.kind = PolicyKind::Learned;
                c.learned_fallback = FallbackKind::Fixed;
                c.rf = 300;
            }),
            "rf",
            "outside",
        ),
    ];
    for (cfg, key, needle) in cases {
        let e = cfg.validate().unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains(&format!("`{key}`")), "{msg}");
        assert!(msg.contains(needle), "{key}: {msg}");
        assert_eq!(key_of(e.clone()), key);
        // build_policy refuses the same config with the same message.
        let be = build_policy(&cfg, None).err().unwrap();
        assert_eq!(be, e);
    }
    // rf out of bounds does not matter when fixed is not used.
    with(|c| {
        c.kind = PolicyKind::Score;
        c.rf = 200;
    })
    .validate()
    .unwrap();
}

#[test]
fn command_line_lists() {
    let t = parse_metric_list("loss,1-accuracy, 1 - val_accuracy").unwrap();
    assert_eq!(t, default_terms());
    let e = parse_metric_list("loss,,accuracy").unwrap_err();
    assert_eq!(key_of(e), "score_metrics");
    assert_eq!(parse_weight_list("1, 0.5,2").unwrap(), [1.0, 0.5, 2.0]);
    let e = parse_weight_list("1,x").unwrap_err();
    assert!(e.to_string().contains("`x`"), "{e}");
    assert!(parse_weight_list("1,inf").is_err());
    assert_eq!(
        "learned".parse::<PolicyKind>().unwrap(),
        PolicyKind::Learned
    );
    assert_eq!(key_of("lstm".parse::<PolicyKind>().unwrap_err()), "kind");
    assert_eq!(
        "fixed".parse::<FallbackKind>().unwrap(),
        FallbackKind::Fixed
    );
    assert_eq!(
        "per-mini-epoch".parse::<Scope>().unwrap(),
        Scope::PerMiniEpoch
    );
}

#[test]
fn builds_bounded_policies() {
    let p = build_policy(&PolicyConfig::default(), None).unwrap();
    assert_eq!((p.name(), p.expected_rf()), ("fixed", 4.0));

    let mut p = build_policy(
        &with(|c| {
            c.kind = PolicyKind::Score;
            c.rf_min = 2;
            c.score_wait = 1;
        }),
        None,
    )
    .unwrap();
    assert_eq!(p.name(), "score");
    let m = metrics(1.0, 0.5, 0.5);
    assert_eq!(
        p.on_pass_end(&m, &at(0, 1)).unwrap().verdict,
        Verdict::Repeat
    );
    // wait_th 1 wants out at pass 2 (no improvement); rf_min 2 allows it.
    let d = p.on_pass_end(&m, &at(0, 2)).unwrap();
    assert_eq!((d.verdict, d.score), (Verdict::Advance, Some(2.0)));
    p.on_advance();
    // First pass of the next mini-epoch: no improvement, wait 1, but rf_min holds.
    let d = p.on_pass_end(&m, &at(1, 1)).unwrap();
    assert_eq!(d.verdict, Verdict::Repeat);
    assert_eq!(d.reason.to_json()["bound"], "rf_min");

    let p = build_policy(&with(|c| c.kind = PolicyKind::Bollinger), None).unwrap();
    assert_eq!((p.name(), p.expected_rf()), ("bollinger", 6.0));
    // The bounds apply to the expectation too: the band needs 6 passes, rf_max is 4.
    let p = build_policy(
        &with(|c| {
            c.kind = PolicyKind::Bollinger;
            c.rf_max = 4;
        }),
        None,
    )
    .unwrap();
    assert_eq!(p.expected_rf(), 4.0);
}

#[test]
fn learned_uses_the_schedule_then_the_named_fallback() {
    let cfg = with(|c| {
        c.kind = PolicyKind::Learned;
        c.learned_fallback = FallbackKind::Fixed;
        c.rf = 3;
    });
    let mut p = build_policy(&cfg, Some(vec![1, 2])).unwrap();
    assert_eq!(p.name(), "learned");
    let m = Metrics::new();
    assert_eq!(
        p.on_pass_end(&m, &at(0, 1)).unwrap().verdict,
        Verdict::Advance
    );
    p.on_advance();
    assert_eq!(
        p.on_pass_end(&m, &at(1, 1)).unwrap().verdict,
        Verdict::Repeat
    );
    assert_eq!(
        p.on_pass_end(&m, &at(1, 2)).unwrap().verdict,
        Verdict::Advance
    );
    p.on_advance();
    for passes in 1..3 {
        assert_eq!(
            p.on_pass_end(&m, &at(2, passes)).unwrap().verdict,
            Verdict::Repeat
        );
    }
    let d = p.on_pass_end(&m, &at(2, 3)).unwrap();
    assert_eq!(
        (d.verdict, d.reason.to_json()["source"].clone()),
        (Verdict::Advance, "fallback".into())
    );

    // No history yet: the default fallback (score) decides from the first mini-epoch.
    let mut p = build_policy(&with(|c| c.kind = PolicyKind::Learned), None).unwrap();
    let d = p.on_pass_end(&metrics(1.0, 0.5, 0.5), &at(0, 1)).unwrap();
    assert_eq!(d.reason.to_json()["fallback"]["policy"], "score");
    // A schedule is ignored by other kinds.
    let p = build_policy(&PolicyConfig::default(), Some(vec![9])).unwrap();
    assert_eq!(p.expected_rf(), 4.0);
}

#[test]
fn the_papers_variants_are_settings() {
    let c: PolicyConfig = toml::from_str(
        r#"
        rf_policy = "bollinger"
        rf_max = 64
        score_metrics = ["val_accuracy"]
        bollinger_window = 20
        bollinger_std = "population"
        bollinger_current = "included"
        bollinger_scope = "per_mini_epoch"
        bollinger_side = "above"
        "#,
    )
    .unwrap();
    c.validate().unwrap();
    assert_eq!(
        (c.bollinger_std, c.bollinger_current, c.bollinger_side),
        (Spread::Population, CurrentPoint::Included, BandSide::Above)
    );
    let mut p = build_policy(&c, None).unwrap();
    // The band over 19 previous scores and the current one exists from pass 20.
    assert_eq!(p.expected_rf(), 20.0);
    let m = |x: f64| -> Metrics { [("val_accuracy".to_string(), x)].into_iter().collect() };
    for i in 1..20 {
        let d = p.on_pass_end(&m(0.5), &at(0, i)).unwrap();
        assert_eq!(d.reason.to_json()["filling"], true);
    }
    let d = p.on_pass_end(&m(0.9), &at(0, 20)).unwrap();
    assert_eq!(d.verdict, Verdict::Advance, "{}", d.reason);
    // With the current point included the band fills one pass sooner: a window of rf_max is
    // usable per mini-epoch, one more is not.
    with(|c| {
        c.kind = PolicyKind::Bollinger;
        c.bollinger_scope = Scope::PerMiniEpoch;
        c.bollinger_current = CurrentPoint::Included;
        c.bollinger_window = 5;
        c.rf_max = 5;
    })
    .validate()
    .unwrap();
    // Score, the paper's other reading: a per-mini-epoch best on val_loss alone.
    let c: PolicyConfig = toml::from_str(
        "rf_policy = \"score\"\nscore_metrics = \"val_loss\"\nbest_scope = \"per_mini_epoch\"",
    )
    .unwrap();
    let mut p = build_policy(&c, None).unwrap();
    let v = |x: f64| -> Metrics { [("val_loss".to_string(), x)].into_iter().collect() };
    let d = p.on_pass_end(&v(0.7), &at(0, 1)).unwrap();
    assert_eq!(d.reason.to_json()["best_scope"], "per_mini_epoch");
    for (key, text) in [
        ("bollinger_std", "bollinger_std = \"biased\""),
        ("bollinger_current", "bollinger_current = \"maybe\""),
    ] {
        let e = toml::from_str::<PolicyConfig>(text)
            .unwrap_err()
            .to_string();
        assert!(e.contains(key) || e.contains("unknown"), "{e}");
    }
}

#[test]
fn paced_is_selectable_but_not_the_default() {
    assert_eq!(PolicyConfig::default().kind, PolicyKind::Fixed);
    let c = PolicyConfig::default();
    assert_eq!(
        (c.paced_cap_start, c.paced_cap_end, c.paced_gain_fraction),
        (4, 32, 0.5)
    );
    let c: PolicyConfig = toml::from_str("rf_policy = \"paced\"\npaced_cap_end = 16").unwrap();
    let mut p = build_policy(&c, None).unwrap();
    assert_eq!(p.name(), "paced");
    assert_eq!("paced".parse::<PolicyKind>().unwrap(), PolicyKind::Paced);
    let s = PassState {
        progress: Some(1.0),
        next_ready: Some(true),
        ..PassState::new(16, 0)
    };
    let d = p.on_pass_end(&Metrics::new(), &s).unwrap();
    assert_eq!(
        (d.verdict, d.reason.to_json()["cap"].clone()),
        (Verdict::Advance, 16.into())
    );
}

#[test]
fn paced_settings_name_the_key() {
    let paced = |f: &dyn Fn(&mut PolicyConfig)| {
        with(|c| {
            c.kind = PolicyKind::Paced;
            f(c)
        })
    };
    let cases: Vec<(PolicyConfig, &str, &str)> = vec![
        (
            paced(&|c| c.rf_min = 5),
            "paced_cap_start",
            "floor would exceed the cap",
        ),
        (
            paced(&|c| c.paced_cap_start = 0),
            "paced_cap_start",
            "at least 1",
        ),
        (
            paced(&|c| c.paced_cap_end = 2),
            "paced_cap_end",
            "below paced_cap_start",
        ),
        (paced(&|c| c.rf_max = 16), "paced_cap_end", "above rf_max"),
        (
            paced(&|c| c.paced_gain_fraction = -0.1),
            "paced_gain_fraction",
            "outside [0, 1]",
        ),
    ];
    for (cfg, key, needle) in cases {
        let e = cfg.validate().unwrap_err();
        let msg = e.to_string();
        assert_eq!(key_of(e.clone()), key, "{msg}");
        assert!(msg.contains(needle), "{key}: {msg}");
        assert_eq!(build_policy(&cfg, None).err().unwrap(), e);
    }
    // The floor against the cap matters only for the policy that runs.
    with(|c| (c.kind, c.rf_min) = (PolicyKind::Score, 5))
        .validate()
        .unwrap();
}
