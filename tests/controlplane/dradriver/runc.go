package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// The annotations containerd's CRI plugin puts on a container's OCI spec.
const (
	containerTypeAnnotation = "io.kubernetes.cri.container-type"
	podNamespaceAnnotation  = "io.kubernetes.cri.sandbox-namespace"
	podNameAnnotation       = "io.kubernetes.cri.sandbox-name"
)

// runc is `dradriver runc --runc PATH --cdi-dir DIR --consumers-dir DIR -- RUNC-ARGS...`:
// before `runc create` of a pod's container, the environment of the CDI devices the
// driver recorded for the pod is added to the bundle's OCI spec; then the real runc runs
// with the same arguments (it replaces this process). Returns only on failure.
func runc(args []string) int {
	flags := flag.NewFlagSet("dradriver runc", flag.ContinueOnError)
	real := flags.String("runc", "runc", "the real runc")
	cdiDir := flags.String("cdi-dir", "", "the driver's CDI spec directory")
	consumersDir := flags.String("consumers-dir", "", "the driver's records of the pods consuming each claim")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	runcArgs := flags.Args()
	if bundle, ok := createdBundle(runcArgs); ok {
		if err := inject(bundle, *cdiDir, *consumersDir); err != nil {
			fmt.Fprintf(os.Stderr, "dradriver runc: CDI devices of %s: %v\n", bundle, err)
			return 1
		}
	}
	err := syscall.Exec(*real, append([]string{*real}, runcArgs...), os.Environ())
	fmt.Fprintf(os.Stderr, "dradriver runc: running %s: %v\n", *real, err)
	return 1
}

// createdBundle is the bundle of a `runc [global flags] create --bundle DIR ... ID`.
func createdBundle(args []string) (string, bool) {
	create := -1
	for i, a := range args {
		if a == "create" {
			create = i
			break
		}
	}
	if create < 0 {
		return "", false
	}
	for i := create + 1; i < len(args); i++ {
		a := args[i]
		switch {
		case (a == "--bundle" || a == "-b") && i+1 < len(args):
			return args[i+1], true
		case strings.HasPrefix(a, "--bundle="):
			return strings.TrimPrefix(a, "--bundle="), true
		}
	}
	// runc's default bundle is the working directory.
	dir, err := os.Getwd()
	return dir, err == nil
}

// inject adds to the bundle's process environment that of every CDI device recorded for
// its pod; a sandbox, or a pod with no claim of the driver, is left as it is.
func inject(bundle, cdiDir, consumersDir string) error {
	path := filepath.Join(bundle, "config.json")
	text, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var spec map[string]any
	if err := json.Unmarshal(text, &spec); err != nil {
		return err
	}
	annotations, _ := spec["annotations"].(map[string]any)
	if annotations[containerTypeAnnotation] != "container" {
		return nil
	}
	namespace, _ := annotations[podNamespaceAnnotation].(string)
	pod, _ := annotations[podNameAnnotation].(string)
	records, _ := filepath.Glob(filepath.Join(consumersDir, podKey(namespace, pod), "*"))
	if len(records) == 0 {
		return nil
	}
	var env []string
	for _, r := range records {
		id, err := os.ReadFile(r)
		if err != nil {
			return err
		}
		edits, err := cdiEnv(cdiDir, string(id))
		if err != nil {
			return err
		}
		env = append(env, edits...)
	}
	process, ok := spec["process"].(map[string]any)
	if !ok {
		return fmt.Errorf("%s has no process", path)
	}
	process["env"] = withEnv(process["env"], env)
	out, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	return os.WriteFile(path, out, 0o644)
}

// cdiEnv is the environment of the CDI device `kind=name` in the specs of `dir`.
func cdiEnv(dir, id string) ([]string, error) {
	kind, name, ok := strings.Cut(id, "=")
	if !ok {
		return nil, fmt.Errorf("malformed CDI device %q", id)
	}
	specs, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	for _, path := range specs {
		text, err := os.ReadFile(path)
		if err != nil {
			continue // removed meanwhile
		}
		var spec cdiSpec
		if json.Unmarshal(text, &spec) != nil || spec.Kind != kind {
			continue
		}
		for _, d := range spec.Devices {
			if d.Name == name {
				return d.ContainerEdits.Env, nil
			}
		}
	}
	return nil, fmt.Errorf("no CDI spec in %s defines %s", dir, id)
}

// withEnv is the OCI `env` list with `add` set, a variable given again replaced.
func withEnv(current any, add []string) []string {
	var out []string
	set := map[string]bool{}
	for _, kv := range add {
		name, _, _ := strings.Cut(kv, "=")
		set[name] = true
	}
	list, _ := current.([]any)
	for _, v := range list {
		if kv, ok := v.(string); ok {
			if name, _, _ := strings.Cut(kv, "="); !set[name] {
				out = append(out, kv)
			}
		}
	}
	return append(out, add...)
}
