# Source this file to use the test tools installed by tests/tools/install.sh:
#   . tests/tools/env.sh
# Exports NEURON_TOOLS_DIR (default <repo>/target/tools) and puts its bin/ first on PATH.
_neuron_repo=$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/../.." && pwd)
export NEURON_TOOLS_DIR=${NEURON_TOOLS_DIR:-$_neuron_repo/target/tools}
case ":$PATH:" in
*":$NEURON_TOOLS_DIR/bin:"*) ;;
*) export PATH=$NEURON_TOOLS_DIR/bin:$PATH ;;
esac
unset _neuron_repo
