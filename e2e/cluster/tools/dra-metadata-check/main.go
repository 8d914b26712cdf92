// Command dra-metadata-check reads DRA device metadata files the way a workload's Go reader does: with
// k8s.io/dynamic-resource-allocation/devicemetadata (DecodeMetadataFromStream, validation on). It then
// encodes what it decoded again, once per API version the file holds and in the file's order, with the
// serializer the upstream kubelet-plugin helper writes these files with, and requires the same bytes.
// For each file it prints one JSON line: {"file", "versions", "metadata"} (metadata as v1beta1).
// It exits 1 naming the file and the problem when a file cannot be decoded, is not valid, or differs.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	runtimeserializer "k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/dynamic-resource-allocation/api/metadata"
	"k8s.io/dynamic-resource-allocation/api/metadata/install"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
	"k8s.io/dynamic-resource-allocation/devicemetadata"
)

func main() {
	files := os.Args[1:]
	if len(files) == 0 {
		fmt.Fprintln(os.Stderr, "usage: dra-metadata-check FILE...")
		os.Exit(2)
	}
	scheme := install.NewScheme()
	codecs := runtimeserializer.NewCodecFactory(scheme)
	info, ok := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), runtime.ContentTypeJSON)
	if !ok {
		fmt.Fprintln(os.Stderr, "error: no JSON serializer in the metadata scheme")
		os.Exit(1)
	}
	failed := false
	for _, file := range files {
		line, err := check(file, codecs, info.PrettySerializer)
		if err != nil {
			fmt.Fprintf(os.Stderr, "error: %s: %v\n", file, err)
			failed = true
			continue
		}
		fmt.Println(string(line))
	}
	if failed {
		os.Exit(1)
	}
}

func check(file string, codecs runtimeserializer.CodecFactory, pretty runtime.Serializer) ([]byte, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var decoded metadata.DeviceMetadata
	var invalid error
	err = devicemetadata.DecodeMetadataFromStream(json.NewDecoder(bytes.NewReader(data)), &decoded,
		devicemetadata.DecodeMetadataWithValidationResult(&invalid))
	if err != nil {
		return nil, fmt.Errorf("the reference reader cannot decode it: %w", err)
	}
	if invalid != nil {
		return nil, fmt.Errorf("not valid: %w", invalid)
	}
	versions, err := streamVersions(data)
	if err != nil {
		return nil, err
	}
	var again bytes.Buffer
	for _, version := range versions {
		gv, err := schema.ParseGroupVersion(version)
		if err != nil {
			return nil, fmt.Errorf("apiVersion %q: %w", version, err)
		}
		encoded, err := runtime.Encode(codecs.EncoderForVersion(pretty, gv), &decoded)
		if err != nil {
			return nil, fmt.Errorf("encode as %s: %w", version, err)
		}
		again.Write(encoded)
		again.WriteByte('\n')
	}
	if !bytes.Equal(again.Bytes(), data) {
		return nil, fmt.Errorf("differs from what the reference writer makes of it at byte %d:\n--- file\n%s\n--- reference\n%s",
			firstDifference(data, again.Bytes()), data, again.Bytes())
	}
	var current metadatav1beta1.DeviceMetadata
	if _, _, err := codecs.UniversalDeserializer().Decode(firstObject(data), nil, &current); err != nil {
		return nil, err
	}
	return json.Marshal(map[string]any{"file": file, "versions": versions, "metadata": current})
}

// streamVersions lists the apiVersion of every object in the stream, in order.
func streamVersions(data []byte) ([]string, error) {
	decoder := json.NewDecoder(bytes.NewReader(data))
	var versions []string
	for decoder.More() {
		var object struct {
			APIVersion string `json:"apiVersion"`
		}
		if err := decoder.Decode(&object); err != nil {
			return nil, fmt.Errorf("object %d of the stream: %w", len(versions), err)
		}
		versions = append(versions, object.APIVersion)
	}
	return versions, nil
}

func firstObject(data []byte) []byte {
	var raw json.RawMessage
	_ = json.NewDecoder(bytes.NewReader(data)).Decode(&raw)
	return raw
}

func firstDifference(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
