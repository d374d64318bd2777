package coordinator

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/strata-llm/strata/sched"
)

// Seconds a client is asked to wait before retrying.
const (
	retryQueueFull = 1 // the queue drains within a step or two
	retryNotReady  = 5 // a pipeline (re)loads in seconds
)

// apiError is a response in OpenAI's error envelope.
type apiError struct {
	status     int
	typ        string // invalid_request_error, authentication_error, ...
	msg        string
	param      string // the offending request field, "" for none
	code       string // "" for none
	retryAfter int    // seconds; 0 for no Retry-After header
}

func (e *apiError) Error() string { return fmt.Sprintf("%d %s: %s", e.status, e.typ, e.msg) }

type errorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

type errorEnvelope struct {
	Error errorBody `json:"error"`
}

func (e *apiError) envelope() errorEnvelope {
	b := errorBody{Message: e.msg, Type: e.typ}
	if e.param != "" {
		b.Param = &e.param
	}
	if e.code != "" {
		b.Code = &e.code
	}
	return errorEnvelope{b}
}

// invalid is a 400 about param ("" when it is about the whole request).
func invalid(param, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", param: param, msg: fmt.Sprintf(format, args...)}
}

// unsupported is a 400 for a field strata does not implement.
func unsupported(param, format string, args ...any) *apiError {
	e := invalid(param, format, args...)
	e.code = "unsupported_parameter"
	return e
}

func errUnknownModel(name string) *apiError {
	return &apiError{status: http.StatusNotFound, typ: "not_found_error", param: "model", code: "model_not_found",
		msg: fmt.Sprintf("the model %q does not exist", name)}
}

func errTooLarge(got, limit int64) *apiError {
	msg := fmt.Sprintf("request body must be <= %d bytes", limit)
	if got >= 0 {
		msg += fmt.Sprintf(", got %d", got)
	}
	return &apiError{status: http.StatusRequestEntityTooLarge, typ: "invalid_request_error", code: "request_too_large", msg: msg}
}

func errNotReady(err error) *apiError {
	return &apiError{status: http.StatusServiceUnavailable, typ: "server_error", code: "service_unavailable",
		msg: "not ready: " + err.Error(), retryAfter: retryNotReady}
}

// errUnavailable answers a request no pipeline can serve (ErrUnavailable):
// 503, saying why.
func errUnavailable(err error) *apiError {
	return &apiError{status: http.StatusServiceUnavailable, typ: "server_error", code: "service_unavailable",
		msg: err.Error(), retryAfter: retryNotReady}
}

func errInternal(format string, args ...any) *apiError {
	return &apiError{status: http.StatusInternalServerError, typ: "server_error", code: "internal_error", msg: fmt.Sprintf(format, args...)}
}

// submitError maps an error from Engine.Submit to a response.
func submitError(err error) *apiError {
	le, _ := errors.AsType[*sched.LimitError](err)
	switch {
	case errors.Is(err, ErrQueueFull):
		msg := "the waiting queue is full"
		if le != nil {
			msg = fmt.Sprintf("the waiting queue is full: %s exceeds %s %d; retry later", le.What, le.Limit, le.Max)
		}
		return &apiError{status: http.StatusTooManyRequests, typ: "rate_limit_exceeded", code: "rate_limit_exceeded",
			msg: msg, retryAfter: retryQueueFull}
	case errors.Is(err, ErrNeverFits):
		if le != nil {
			return invalid("max_tokens", "the request can never run: %s = %d exceeds %s %d", le.What, le.Got, le.Limit, le.Max)
		}
		return invalid("max_tokens", "the request can never run: %v", err)
	case errors.Is(err, ErrNotReady):
		return errNotReady(err)
	case errors.Is(err, ErrUnavailable):
		return errUnavailable(err)
	case errors.Is(err, ErrStopped):
		return &apiError{status: http.StatusServiceUnavailable, typ: "server_error", code: "service_unavailable",
			msg: "the server is not accepting requests (shutting down)", retryAfter: retryNotReady}
	}
	return errInternal("submit: %v", err)
}
