package tool

import "context"

type subjectKey struct{}

// WithSubject returns ctx carrying sub, the verified caller a source acts
// for: a source that sends each caller's own credential upstream reads it
// with SubjectFrom.
func WithSubject(ctx context.Context, sub string) context.Context {
	return context.WithValue(ctx, subjectKey{}, sub)
}

// SubjectFrom is the subject WithSubject put in ctx, or "".
func SubjectFrom(ctx context.Context) string {
	s, _ := ctx.Value(subjectKey{}).(string)
	return s
}
