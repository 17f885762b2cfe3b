//! The operator binary. Its controller arrives with the NeuronMonitorConfig API; until
//! then it only tells what it is.

fn main() -> anyhow::Result<()> {
    anyhow::bail!("neuron-operator: the controller is not implemented yet")
}
