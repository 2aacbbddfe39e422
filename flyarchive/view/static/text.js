// Text from the archive (world variables, names) as the page shows it: control and other
// invisible characters (terminal escapes, bidirectional overrides, zero-width marks,
// line separators) written as \x1b, \u202e..., so that what is shown is what is stored.
// Always set with textContent, never as HTML.

// C0/C1 controls, soft hyphen, Arabic letter mark, zero-width and bidirectional marks,
// line/paragraph separators, invisible operators, byte order mark, other format characters
const INVISIBLE = /[\p{Cc}\p{Cf}\p{Co}\p{Cs}\p{Cn}\p{Zl}\p{Zp}]/gu;

export function visible(text) {
  return String(text).replace(INVISIBLE, (c) => {
    const code = c.codePointAt(0);
    if (code < 0x100) return `\\x${code.toString(16).padStart(2, "0")}`;
    return code < 0x10000 ? `\\u${code.toString(16).padStart(4, "0")}` : `\\U${code.toString(16).padStart(8, "0")}`;
  });
}
