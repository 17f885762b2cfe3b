# Source this file to use the test tools installed by tests/tools/install.sh:
#   . tests/tools/env.sh
# Exports NEURON_TOOLS_DIR (default <repo>/target/tools) and puts its bin/ first on PATH
# (and, with NEURON_K8S_VERSION, that version's control plane and node binaries before it).
_neuron_repo=$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/../.." && pwd)
export NEURON_TOOLS_DIR=${NEURON_TOOLS_DIR:-$_neuron_repo/target/tools}
case ":$PATH:" in
*":$NEURON_TOOLS_DIR/bin:"*) ;;
*) export PATH=$NEURON_TOOLS_DIR/bin:$PATH ;;
esac
# NEURON_K8S_VERSION (tests/tools/install.sh): that Kubernetes version's control plane
# and node binaries first.
if [ -n "${NEURON_K8S_VERSION:-}" ]; then
  case ":$PATH:" in
  *":$NEURON_TOOLS_DIR/k8s-v$NEURON_K8S_VERSION/bin:"*) ;;
  *) export PATH=$NEURON_TOOLS_DIR/k8s-v$NEURON_K8S_VERSION/bin:$PATH ;;
  esac
fi
unset _neuron_repo
