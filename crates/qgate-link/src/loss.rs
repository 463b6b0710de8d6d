//! Random loss models for a link direction: Bernoulli and Gilbert–Elliott.

use rand::Rng;
use serde::{Deserialize, Serialize};

/// How a link direction loses packets on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum LossModel {
    /// No random loss.
    #[default]
    None,
    /// Each packet lost independently with probability `p`.
    Bernoulli {
        /// Loss probability in [0, 1].
        p: f64,
    },
    /// Two-state Markov chain (Gilbert–Elliott): in state Good a packet is lost with
    /// `loss_good`, in state Bad with `loss_bad`; after each packet the chain moves Good→Bad with
    /// probability `p` and Bad→Good with probability `r`.
    GilbertElliott {
        /// P(Good → Bad) per packet.
        p: f64,
        /// P(Bad → Good) per packet.
        r: f64,
        /// Loss probability in Good (often 0).
        loss_good: f64,
        /// Loss probability in Bad (often 1).
        loss_bad: f64,
    },
}

impl LossModel {
    /// A Gilbert–Elliott chain with no loss in Good and certain loss in Bad whose long-run loss
    /// rate is `rate` and whose loss bursts last `mean_burst` packets on average:
    /// r = 1 / mean_burst, and the stationary P(Bad) = p / (p + r) = rate.
    pub fn bursty(rate: f64, mean_burst: f64) -> LossModel {
        let r = 1.0 / mean_burst.max(1.0);
        let p = if rate >= 1.0 {
            1.0
        } else {
            rate * r / (1.0 - rate)
        };
        LossModel::GilbertElliott {
            p: p.min(1.0),
            r,
            loss_good: 0.0,
            loss_bad: 1.0,
        }
    }

    /// The long-run fraction of packets lost.
    pub fn mean_loss(&self) -> f64 {
        match *self {
            LossModel::None => 0.0,
            LossModel::Bernoulli { p } => p,
            LossModel::GilbertElliott {
                p,
                r,
                loss_good,
                loss_bad,
            } => {
                if p + r == 0.0 {
                    return loss_good;
                }
                let bad = p / (p + r);
                bad * loss_bad + (1.0 - bad) * loss_good
            }
        }
    }

    /// Check every probability is in [0, 1].
    pub fn validate(&self) -> Result<(), String> {
        let probs: &[(&str, f64)] = match self {
            LossModel::None => &[],
            LossModel::Bernoulli { p } => &[("p", *p)],
            LossModel::GilbertElliott {
                p,
                r,
                loss_good,
                loss_bad,
            } => &[
                ("p", *p),
                ("r", *r),
                ("loss_good", *loss_good),
                ("loss_bad", *loss_bad),
            ],
        };
        for (name, v) in probs {
            if !(0.0..=1.0).contains(v) {
                return Err(format!(
                    "loss parameter {name} = {v} is not a probability in [0, 1]"
                ));
            }
        }
        Ok(())
    }
}

/// The running state of a loss model (the Gilbert–Elliott chain's current state).
#[derive(Debug, Clone, Default)]
pub struct LossState {
    bad: bool,
}

impl LossState {
    /// Decide the fate of one packet; advances the chain.
    pub fn lose(&mut self, model: &LossModel, rng: &mut impl Rng) -> bool {
        match *model {
            LossModel::None => false,
            LossModel::Bernoulli { p } => p > 0.0 && rng.random::<f64>() < p,
            LossModel::GilbertElliott {
                p,
                r,
                loss_good,
                loss_bad,
            } => {
                let loss = if self.bad { loss_bad } else { loss_good };
                let lost = loss > 0.0 && rng.random::<f64>() < loss;
                let flip = if self.bad { r } else { p };
                if rng.random::<f64>() < flip {
                    self.bad = !self.bad;
                }
                lost
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    const N: usize = 200_000;

    #[test]
    fn bernoulli_rate_is_right() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let model = LossModel::Bernoulli { p: 0.05 };
        let mut st = LossState::default();
        let lost = (0..N).filter(|_| st.lose(&model, &mut rng)).count();
        let rate = lost as f64 / N as f64;
        // 5 standard errors: sqrt(p(1-p)/N) ≈ 0.00049.
        assert!((rate - 0.05).abs() < 0.0025, "rate {rate}");
    }

    #[test]
    fn gilbert_elliott_rate_and_burst_length_are_right() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let model = LossModel::bursty(0.02, 4.0);
        assert!((model.mean_loss() - 0.02).abs() < 1e-12);
        let mut st = LossState::default();
        let outcomes: Vec<bool> = (0..N).map(|_| st.lose(&model, &mut rng)).collect();
        let lost = outcomes.iter().filter(|&&l| l).count();
        let rate = lost as f64 / N as f64;
        // Bursts: maximal runs of losses.
        let mut bursts = 0usize;
        let mut prev = false;
        for &l in &outcomes {
            if l && !prev {
                bursts += 1;
            }
            prev = l;
        }
        let mean_burst = lost as f64 / bursts as f64;
        assert!((rate - 0.02).abs() < 0.003, "rate {rate}");
        assert!((mean_burst - 4.0).abs() < 0.4, "mean burst {mean_burst}");
    }

    #[test]
    fn validate_names_the_parameter() {
        let e = LossModel::Bernoulli { p: 1.5 }.validate().unwrap_err();
        assert!(e.contains("p = 1.5"), "{e}");
    }
}
