package router

import (
	"bytes"
	"fmt"
	"strings"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"github.com/capgate/capgate/tool"
)

// schemaCache compiles each distinct input schema once. Schemas are keyed
// by their bytes, so a tool whose definition changes gets a new entry.
type schemaCache struct {
	m *lru.Cache[string, *compiledSchema]
}

const maxCachedSchemas = 4096

func newSchemaCache() schemaCache {
	m, _ := lru.New[string, *compiledSchema](maxCachedSchemas)
	return schemaCache{m: m}
}

type compiledSchema struct {
	schema *jsonschema.Schema
	err    error
	// emptyErr is the schema's verdict on an empty object, the input of
	// most calls without arguments: validating is deterministic, so it is
	// worked out once.
	emptyErr error
}

var printer = message.NewPrinter(language.English)

// validate checks input (decoded with UseNumber) against d's input schema.
// A schema that does not compile refuses every call: fail closed.
func (c *schemaCache) validate(d *tool.Descriptor, input any) error {
	raw := bytes.TrimSpace(d.InputSchema)
	if len(raw) == 0 {
		return nil
	}
	cs, ok := c.m.Get(string(raw))
	if !ok {
		cs = compileSchema(raw)
		c.m.Add(string(raw), cs)
	}
	if cs.err != nil {
		return &tool.Error{Code: tool.CodeInvalidInput, Gate: GateInput, Err: cs.err,
			Message: fmt.Sprintf("%s has an input schema that does not compile; no call is accepted", d.ID)}
	}
	var err error
	if m, ok := input.(map[string]any); ok && len(m) == 0 {
		err = cs.emptyErr
	} else {
		err = cs.schema.Validate(input)
	}
	if err == nil {
		return nil
	}
	ve, ok := err.(*jsonschema.ValidationError)
	if !ok {
		return &tool.Error{Code: tool.CodeInvalidInput, Gate: GateInput, Message: "input is invalid: " + err.Error()}
	}
	var problems []string
	leaves(ve, &problems)
	return &tool.Error{Code: tool.CodeInvalidInput, Gate: GateInput,
		Message: "input is invalid: " + strings.Join(problems, "; ")}
}

// leaves collects the innermost errors, each named by the field it is
// about: "input.folder: got number, want string".
func leaves(ve *jsonschema.ValidationError, out *[]string) {
	if len(ve.Causes) == 0 {
		where := "input"
		for _, p := range ve.InstanceLocation {
			where += "." + p
		}
		*out = append(*out, where+": "+ve.ErrorKind.LocalizedString(printer))
		return
	}
	for _, c := range ve.Causes {
		leaves(c, out)
	}
}

func compileSchema(raw []byte) *compiledSchema {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return &compiledSchema{err: err}
	}
	c := jsonschema.NewCompiler()
	// No network, no files: a $ref outside the schema does not load.
	c.UseLoader(noLoader{})
	const url = "mem:///input.json"
	if err := c.AddResource(url, doc); err != nil {
		return &compiledSchema{err: err}
	}
	s, err := c.Compile(url)
	if err != nil {
		return &compiledSchema{err: err}
	}
	return &compiledSchema{schema: s, emptyErr: s.Validate(map[string]any{})}
}

type noLoader struct{}

func (noLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("loading %s is not allowed", url)
}
