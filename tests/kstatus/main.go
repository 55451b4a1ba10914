// kstatus reads Kubernetes objects as JSON (one array on stdin) and prints, for each,
// the verdict of sigs.k8s.io/cli-utils' kstatus library: the same library Flux's health
// checks and `kubectl wait`-style tools use. The Argo CD health-check tests compare their
// Lua verdicts against these.
//
// Output: a JSON array of {"status": ..., "message": ...}, in input order.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type verdict struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

func main() {
	raw, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kstatus: reading stdin:", err)
		os.Exit(2)
	}
	// The apimachinery decoder keeps integers as int64, as the apiserver's clients do
	// (encoding/json would make metadata.generation a float64, which kstatus rejects).
	var objects []interface{}
	if err := utiljson.Unmarshal(raw, &objects); err != nil {
		fmt.Fprintln(os.Stderr, "kstatus: stdin is not a JSON array of objects:", err)
		os.Exit(2)
	}
	out := make([]verdict, 0, len(objects))
	for i, item := range objects {
		obj, ok := item.(map[string]interface{})
		if !ok {
			fmt.Fprintf(os.Stderr, "kstatus: item %d is not an object\n", i)
			os.Exit(2)
		}
		res, err := status.Compute(&unstructured.Unstructured{Object: obj})
		if err != nil {
			fmt.Fprintf(os.Stderr, "kstatus: object %d: %v\n", i, err)
			os.Exit(1)
		}
		out = append(out, verdict{Status: res.Status.String(), Message: res.Message})
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, "kstatus: writing stdout:", err)
		os.Exit(1)
	}
}
