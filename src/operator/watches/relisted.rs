//! An index kept beside a reflector store from the same watch events, with
//! the store's relist semantics: a relist fills a fresh index, swapped in
//! only once the list is done, so a reader never sees half a list.

use kube::runtime::watcher::Event;

#[derive(Default)]
pub struct Relisted<I> {
    live: I,
    /// Filled during a relist, swapped in when it is done.
    relisting: Option<I>,
}

impl<I: Default> Relisted<I> {
    /// Follows one watch event: `add` for an object listed or applied,
    /// `remove` for one deleted.
    pub fn follow<K>(
        &mut self,
        event: &Event<K>,
        add: impl Fn(&mut I, &K),
        remove: impl Fn(&mut I, &K),
    ) {
        match event {
            Event::Init => self.relisting = Some(I::default()),
            Event::InitApply(o) => add(self.relisting.as_mut().unwrap_or(&mut self.live), o),
            Event::InitDone => {
                if let Some(index) = self.relisting.take() {
                    self.live = index;
                }
            }
            Event::Apply(o) => add(&mut self.live, o),
            Event::Delete(o) => remove(&mut self.live, o),
        }
    }

    /// The index as of the last complete list and the events since.
    pub fn live(&self) -> &I {
        &self.live
    }
}
